//! The `api` function: the same HTTP router as `baton dev`, behind API Gateway (HTTP API).
//! The caller is the subject of the JWT that API Gateway's authorizer verified (operators:
//! `BATON_OPERATORS`). It never
//! calls a model: steps run in the orchestrator and subagent functions.

fn main() -> Result<(), baton_lambda::Error> {
    baton_lambda::main(baton_lambda::Role::Api, Default::default())
}
