//! `GET /openapi.json`: the API's OpenAPI 3.1 document. The schemas are generated from the
//! types the router parses and serializes (`schemars` on the core's `Run`, `Entry`, `Cta`,
//! `CtaResponse`… and on the bodies of `bodies.rs`), so they cannot drift from them;
//! CI fuzzes the served API against it (schemathesis) for 5xx and non-conformance.

use schemars::{JsonSchema, SchemaGenerator, generate::SchemaSettings};
use serde_json::{Map, Value, json};

use baton_core::cta::{Cta, CtaResponse};

use crate::bodies::{
    AnswerAccepted, Audit, CreateRunBody, CtaList, ForkAccepted, ForkBody, Health, Link,
    LinkQuestion, MessageBody, RequestAccepted, RunAccepted, RunList, RunPage, RunTreeBody,
    TimelinePage, UsageBody,
};
use crate::error::ErrorBody;

fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
    g.subschema_for::<T>().to_value()
}

fn json_body(schema: Value) -> Value {
    json!({"application/json": {"schema": schema}})
}

/// What the types alone cannot say of a request, added to their generated schemas (a blank
/// prompt or message is one: the agent answers it with its clarifying reply); `agent` is one
/// of this deployment's; `context`
/// is an object with a non-empty string `type`; a `sandboxId` and a trigger's name are plain
/// names; a message has `text` or a `trigger`, not both.
fn refine(schemas: &mut Map<String, Value>, agents: &[&str]) {
    if let Some(p) = schemas
        .get_mut("CreateRunBody")
        .and_then(|s| s.get_mut("properties"))
    {
        p["prompt"] = json!({"type": "string", "description":
            "What the run is asked. A blank one is answered with the agent's clarifying reply, without a model call."});
        p["agent"] = json!({"anyOf": [{"enum": agents}, {"type": "null"}]});
        p["sandboxId"] = json!({"anyOf": [
            {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, {"type": "null"}]});
        p["context"] = json!({"anyOf": [
            {"type": "object", "required": ["type"],
             "properties": {"type": {"type": "string", "minLength": 1}}},
            {"type": "null"}]});
    }
    if let Some(p) = schemas
        .get_mut("MessageBody")
        .and_then(|s| s.get_mut("properties"))
    {
        p["text"] = json!({"anyOf": [{"type": "string"}, {"type": "null"}]});
    }
    if let Some(m) = schemas
        .get_mut("MessageBody")
        .and_then(Value::as_object_mut)
    {
        m.insert(
            "oneOf".into(),
            json!([
                {"required": ["text"], "properties": {"text": {"type": "string"}, "trigger": {"type": "null"}}},
                {"required": ["trigger"], "properties": {"trigger": {"type": "object"}, "text": {"type": "null"}}}
            ]),
        );
    }
    if let Some(m) = schemas
        .get_mut("ReplacementBody")
        .and_then(Value::as_object_mut)
    {
        m.insert(
            "oneOf".into(),
            json!([
                {"required": ["text"], "properties": {"text": {"type": "string", "minLength": 1, "pattern": "\\S"}, "response": {"type": "null"}}},
                {"required": ["response"], "properties": {"response": {"type": "object"}, "text": {"type": "null"}}}
            ]),
        );
    }
    if let Some(p) = schemas
        .get_mut("TriggerBody")
        .and_then(|s| s.get_mut("properties"))
    {
        p["name"] = json!({"type": "string", "pattern": "^[A-Za-z0-9._:/-]{1,64}$"});
    }
}

/// The whole document, for a deployment whose agents are `agents`.
pub fn document(agents: &[&str]) -> Value {
    let mut g = SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .into_generator();
    let error = schema::<ErrorBody>(&mut g);
    let errors = |codes: &[(&str, &str)]| {
        let mut m = Map::new();
        for (code, why) in codes {
            m.insert(
                (*code).into(),
                json!({"description": why, "content": json_body(error.clone())}),
            );
        }
        m.insert(
            "default".into(),
            json!({"description": "any other refusal, with its code", "content": json_body(error.clone())}),
        );
        m
    };
    let ok = |status: &str, what: &str, body: Value, refusals: &[(&str, &str)]| {
        let mut r = errors(refusals);
        r.insert(
            status.into(),
            json!({"description": what, "content": json_body(body)}),
        );
        Value::Object(r)
    };
    let id = |name: &str, what: &str| {
        json!({"name": name, "in": "path", "required": true, "description": what,
               "schema": {"type": "string"}})
    };
    let run_id = id("runId", "a run's id");
    let cta_id = id("ctaId", "a CTA's id");
    let token = id("token", "a one-time link's token");
    let idem = json!({"name": "Idempotency-Key", "in": "header", "required": false,
        "description": "1 to 255 visible ASCII characters: a retry with it does nothing twice",
        "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"}});
    let common = [
        ("400", "invalid input"),
        ("401", "no or wrong token"),
        ("404", "no such run or CTA (or not yours)"),
    ];
    let public = json!([]);
    let cursor = json!({"type": "integer", "minimum": 0, "maximum": u64::MAX});
    let text = |kind: &str| json!({kind: {"schema": {"type": "string"}}});

    let create = schema::<CreateRunBody>(&mut g);
    let run_accepted = schema::<RunAccepted>(&mut g);
    let run_page = schema::<RunPage<'static>>(&mut g);
    let timeline = schema::<TimelinePage<'static>>(&mut g);
    let message = schema::<MessageBody>(&mut g);
    let fork = schema::<ForkBody>(&mut g);
    let fork_accepted = schema::<ForkAccepted>(&mut g);
    let accepted = schema::<RequestAccepted>(&mut g);
    let ctas = schema::<CtaList>(&mut g);
    let runs = schema::<RunList>(&mut g);
    let tree = schema::<RunTreeBody>(&mut g);
    let usage = schema::<UsageBody>(&mut g);
    let cta = schema::<Cta>(&mut g);
    let response = schema::<CtaResponse>(&mut g);
    let answered = schema::<AnswerAccepted>(&mut g);
    let link = schema::<Link>(&mut g);
    let watch = schema::<crate::live::WatchBody>(&mut g);
    let question = schema::<LinkQuestion<'static>>(&mut g);
    let audit = schema::<Audit>(&mut g);
    let health = schema::<Health>(&mut g);

    let paths = json!({
        "/health": {"get": {"summary": "liveness", "security": public,
            "responses": ok("200", "up", health, &[])}},
        "/runs": {"post": {"summary": "start a run", "parameters": [idem],
            "requestBody": {"required": true, "content": json_body(create)},
            "responses": ok("202", "created; its first step is queued", run_accepted,
                &[("400", "invalid input"), ("401", "no or wrong token"), ("413", "body over 256 KiB"),
                  ("429", "`quota_exceeded`: the caller has as many runs under way as it may, or its runs spent today's allowance (`limit`, `current`; `Retry-After`)")])},
            "get": {"summary": "your runs (top-level), newest first",
            "description": "A page reads `limit` runs created in [`since`, `until`) and keeps those of `status` and `agent`: it may hold fewer, or none, and still have a `nextCursor`.",
            "parameters": [
                {"name": "status", "in": "query", "required": false,
                 "schema": {"enum": ["queued", "running", "waiting", "completed", "failed", "expired", "cancelled", "all"]}},
                {"name": "agent", "in": "query", "required": false, "schema": {"type": "string"}},
                {"name": "owner", "in": "query", "required": false,
                 "description": "another owner's runs (an operator's to read: 403 for others); default yours",
                 "schema": {"type": "string"}},
                {"name": "since", "in": "query", "required": false, "description": "created at or after (RFC 3339)",
                 "schema": {"type": "string", "format": "date-time"}},
                {"name": "until", "in": "query", "required": false, "description": "created before (RFC 3339)",
                 "schema": {"type": "string", "format": "date-time"}},
                {"name": "limit", "in": "query", "required": false,
                 "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}},
                {"name": "cursor", "in": "query", "required": false, "schema": {"type": "string"}}],
            "responses": ok("200", "a page of runs; `nextCursor` when more may follow", runs,
                &[("400", "invalid input"), ("401", "no or wrong token"), ("403", "another owner's runs, asked by a caller who is not an operator"),
                  ("404", "a cursor no page gave")])}},
        "/usage": {"get": {"summary": "your figures against your quotas: runs under way, and what your runs spent today (UTC)",
            "parameters": [{"name": "owner", "in": "query", "required": false, "schema": {"type": "string"},
                "description": "another owner's (an operator's read)"}],
            "responses": ok("200", "the figures; each present while its quota is set", usage,
                &[("401", "no or wrong token"), ("403", "another owner's figures, asked by a caller who is not an operator")])}},
        "/runs/{runId}/tree": {"get": {"summary": "a run and the runs under it (subagents, a plan's steps' runs), with their status, cost and time",
            "parameters": [run_id.clone()],
            "responses": ok("200", "the tree, oldest first, each run's parent before it", tree, &common)}},
        "/runs/{runId}": {"get": {"summary": "a run and the start of its timeline",
            "parameters": [run_id.clone()],
            "responses": ok("200", "the run", run_page, &common)}},
        "/runs/{runId}/timeline": {"get": {"summary": "timeline entries after a cursor",
            "parameters": [run_id.clone(),
                {"name": "after", "in": "query", "required": false, "schema": cursor.clone()},
                {"name": "limit", "in": "query", "required": false, "schema": cursor.clone()}],
            "responses": ok("200", "entries", timeline, &common)}},
        "/runs/{runId}/messages": {"post": {"summary": "a follow-up user turn",
            "parameters": [run_id.clone(), idem],
            "requestBody": {"required": true, "content": json_body(message)},
            "responses": ok("202", "queued", accepted.clone(),
                &[("400", "invalid input"), ("401", "no or wrong token"), ("404", "no such run"), ("409", "ten follow-ups already wait"),
                  ("429", "`quota_exceeded`: the run had ended, and the caller has as many runs under way as it may or spent today's allowance")])}},
        "/runs/{runId}/fork": {"post": {"summary": "a new run whose history is this one's up to an entry, which it replaces",
            "description": "`atSeq` names a `user` turn (its `replacement.text`, or the same text), an `assistant` reply (thought again) or a question, a `tool` entry with a `cta` (its `replacement.response`, or the answer given). The entries before it are copied as recorded: no model or tool call before it runs again.",
            "parameters": [run_id.clone(), idem.clone()],
            "requestBody": {"required": true, "content": json_body(fork)},
            "responses": ok("202", "the fork is created; its first step is queued", fork_accepted,
                &[("400", "invalid input"), ("401", "no or wrong token"), ("404", "no such run"),
                  ("409", "the request does not fit the run's entries (`fork_mismatch`), the history before the entry still waits, or the run is a subagent (`not_forkable`)"),
                  ("429", "`quota_exceeded`: the caller has as many runs under way as it may, or spent today's allowance")])}},
        "/runs/{runId}/cancel": {"post": {"summary": "cancel a run",
            "parameters": [run_id.clone()],
            "responses": ok("202", "the cancel takes its turn", accepted,
                &[("401", "no or wrong token"), ("404", "no such run"), ("409", "the run had ended")])}},
        "/runs/{runId}/stream": {"get": {"summary": "the run's timeline and state as Server-Sent Events (entry, run); Last-Event-ID resumes",
            "description": "Each event's id is the timeline cursor just after it: send the last one received as Last-Event-ID to resume with no gap. The stream ends after the `run` event of a run at rest (ended, or waiting), unless `follow=true`.",
            "parameters": [run_id.clone(),
                {"name": "Last-Event-ID", "in": "header", "required": false,
                 "description": "the id of the last event received: the stream resumes after it",
                 "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"}},
                {"name": "follow", "in": "query", "required": false,
                 "description": "true: stay open while the run is at rest, for what comes next (an answer, a follow-up message); default false",
                 "schema": {"type": "boolean", "default": false}}],
            "responses": {
                "200": {"description": "an event stream: each event's data is JSON, an Entry (`entry`) or the run's status and spend (`run`)",
                    "content": {"text/event-stream": {"schema": {
                        "type": "object", "required": ["event", "data"],
                        "properties": {
                            "event": {"enum": ["entry", "run", "error"]},
                            "data": {"type": "string", "contentMediaType": "application/json"},
                            "id": {"type": "string", "pattern": "^[0-9]*$"}}}}}},
                "501": {"description": "this host does not stream (API Gateway): poll /timeline", "content": json_body(error.clone())},
                "default": {"description": "a refusal", "content": json_body(error.clone())}}}},
        "/runs/{runId}/watch": {"post": {"summary": "how to watch the run live: a grant to its channel (on AWS, AppSync Events), or this host's event stream",
            "description": "A grant (`transport: appsync-events`) lets its holder connect to `realtimeUrl` and subscribe to `channel` with `token` until `expiresAt`; the run's steps stream what they do while a grant holds. Ask again after `renewAfterSeconds` to go on watching. A host that streams itself answers `{transport: sse, url}`.",
            "parameters": [run_id.clone()],
            "responses": {
                "200": {"description": "how to watch", "content": json_body(watch)},
                "501": {"description": "this host has no live channel: poll /timeline", "content": json_body(error.clone())},
                "default": {"description": "a refusal", "content": json_body(error.clone())}}}},
        "/runs/{runId}/files/{fileId}": {"get": {"summary": "a file a tool of the run returned",
            "parameters": [run_id, id("fileId", "a file's id"),
                {"name": "link", "in": "query", "required": false, "schema": {"enum": ["0", "1"]}}],
            "responses": {
                "200": {"description": "its bytes, as its media type; with `link=1`, a file the host serves by a link: `{url}`, as application/vnd.baton.file-link+json",
                    "content": {"*/*": {"schema": {"type": "string", "contentEncoding": "binary"}}}},
                "302": {"description": "a file over 1 MiB where the host serves it from its store (S3): `Location` is a URL valid 5 minutes"},
                "default": {"description": "a refusal", "content": json_body(error.clone())}}}},
        "/ctas": {"get": {"summary": "your CTAs, or (`assigned=me`) those assigned to you",
            "parameters": [
                {"name": "assigned", "in": "query", "required": false, "schema": {"enum": ["me"]}},
                {"name": "status", "in": "query", "required": false,
                 "schema": {"enum": ["pending", "answered", "expired", "cancelled", "all"]}},
                {"name": "rootRunId", "in": "query", "required": false, "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "required": false,
                 "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 50}},
                {"name": "cursor", "in": "query", "required": false, "schema": {"type": "string"}}],
            "responses": ok("200", "a page of CTAs: by status, oldest first; `nextCursor` when more follow", ctas, &common)}},
        "/ctas/{ctaId}": {"get": {"summary": "one CTA (its owner's, or an assignee's)", "parameters": [cta_id.clone()],
            "responses": ok("200", "the CTA", cta.clone(), &common)}},
        "/ctas/{ctaId}/audit": {"get": {"summary": "a CTA's history", "parameters": [cta_id.clone()],
            "responses": ok("200", "its events, oldest first", audit, &common)}},
        "/ctas/{ctaId}/response": {"post": {"summary": "answer a CTA (the first answer wins)",
            "parameters": [cta_id.clone()],
            "requestBody": {"required": true, "content": json_body(response.clone())},
            "responses": ok("202", "recorded", answered.clone(),
                &[("400", "not an answer to this CTA"), ("401", "no or wrong token"),
                  ("403", "`not_assignee`: neither its owner nor an assignee"), ("404", "no such CTA"),
                  ("409", "answered already, or cancelled"), ("410", "expired")])}},
        "/ctas/{ctaId}/link": {"post": {"summary": "a one-time answer link to a pending CTA",
            "parameters": [cta_id],
            "responses": ok("200", "the link", link,
                &[("401", "no or wrong token"), ("404", "no such CTA"), ("409", "settled, or links are off")])}},
        "/links/{token}": {"get": {"summary": "the CTA a one-time link answers", "security": public,
            "parameters": [token.clone()],
            "responses": ok("200", "the question", question,
                &[("403", "not a valid link"), ("409", "used, answered or cancelled"), ("410", "expired")])}},
        "/links/{token}/response": {"post": {"summary": "answer through a one-time link", "security": public,
            "parameters": [token],
            "requestBody": {"required": true, "content": json_body(response)},
            "responses": ok("202", "recorded; the link is used", answered,
                &[("400", "not an answer to this CTA"), ("403", "not a valid link"), ("409", "used, answered or cancelled"), ("410", "expired")])}},
        "/console": {"get": {"summary": "the console (HTML)", "security": public,
            "responses": {"200": {"description": "the page", "content": text("text/html")}}}},
        "/openapi.json": {"get": {"summary": "this document", "security": public,
            "responses": {"200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}}}}}
    });
    let mut schemas = g.take_definitions(true);
    refine(&mut schemas, agents);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Baton",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Durable AI-agent orchestration: runs, their timelines, and the questions (CTAs) they ask humans."
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                "description": "baton dev's token, or on AWS the JWT API Gateway's authorizer checks"}},
            "schemas": Value::Object(schemas),
        }
    })
}
