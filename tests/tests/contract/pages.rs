//! The port contracts of paging: a run's list and the questions' inbox, a page at a time,
//! each item once however the pages fall, on every adapter.

use super::*;

use std::sync::Arc;

use baton_core::cta::{CtaResponse, CtaStatus, Settlement};
use baton_core::ports::{CtaPosition, CtaQuery, RunPage, RunPosition, RunQuery, Settled, Store};
use baton_core::run::{Run, RunStatus};
use chrono::Utc;

/// Creates `n` pending CTAs of `run` (ids `<prefix>_<i>`), created `at`, `at` + 1 ms, …,
/// in commits of up to 90 (a DynamoDB transaction holds 100 items). Returns the run as
/// committed.
async fn raise_ctas(
    store: &dyn Store,
    mut run: Run,
    prefix: &str,
    n: usize,
    at: chrono::DateTime<Utc>,
) -> Run {
    let ids: Vec<usize> = (0..n).collect();
    for chunk in ids.chunks(90) {
        let mut t = next(&run, vec![]);
        t.new_ctas = chunk
            .iter()
            .map(|&i| {
                let mut c = cta(&run, &format!("{prefix}_{i:05}"));
                c.root_run_id = Some(run.root().to_owned());
                c.created_at = at + chrono::Duration::milliseconds(i as i64);
                c
            })
            .collect();
        store.commit(run.version, &t).await.unwrap();
        run = t.run;
    }
    run
}

/// Reads every page of `query` (`limit` a page), checking each page's size; returns the
/// CTAs' ids in the order read.
async fn every_page(store: &dyn Store, owner: &str, mut query: CtaQuery) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        let page = store.list_ctas(owner, &query).await.unwrap();
        assert!(page.len() <= query.limit, "a page of {}", page.len());
        let Some(last) = page.last() else { break };
        query.after = Some(CtaPosition::of(last));
        ids.extend(page.iter().map(|c| c.cta_id.clone()));
    }
    ids
}

/// Pages of an owner's top-level runs: newest first, each page after the last one's
/// position, none skipped or repeated; not a subagent's run, not another owner's; with
/// the metadata they were created with, and as their last commit left them.
pub(super) async fn run_pages_contract(store: Arc<dyn Store>) {
    let at = Utc::now() - chrono::Duration::hours(2);
    for i in 0..7 {
        let (mut run, first) = new_run(&format!("run_ls_{i}"), "lia");
        run.created_at = at + chrono::Duration::seconds(i);
        run.origin.metadata = Some(serde_json::json!({"i": i}));
        store
            .create_run(&run, &first, &[], None, None)
            .await
            .unwrap();
        if i == 3 {
            let t = next(&run, vec![]);
            store.commit(run.version, &t).await.unwrap();
        }
    }
    let (mut child, first) = new_run("run_ls_child", "lia");
    child.origin.parent = Some(baton_core::run::ParentLink {
        run_id: "run_ls_6".into(),
        tool_call_id: "call_1".into(),
    });
    child.origin.root_run_id = Some("run_ls_6".into());
    child.origin.depth = 1;
    child.created_at = at + chrono::Duration::seconds(30);
    store
        .create_run(&child, &first, &[], None, None)
        .await
        .unwrap();
    let (mut other, first) = new_run("run_ls_other", "mo");
    other.created_at = at + chrono::Duration::seconds(40);
    store
        .create_run(&other, &first, &[], None, None)
        .await
        .unwrap();

    let mut ids = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_runs("lia", &RunQuery::page(after.clone(), 3))
            .await
            .unwrap();
        assert!(page.runs.len() <= 3, "a page of {}", page.runs.len());
        // A full page says where the next starts (its last run); a short one, that none does.
        let last = page.runs.last().map(|r| r.run_id.as_str());
        let next = page.next.as_ref().map(|p| p.run_id.as_str());
        assert_eq!(next, last.filter(|_| page.runs.len() == 3));
        for run in &page.runs {
            let i: u64 = run.run_id["run_ls_".len()..].parse().unwrap();
            assert_eq!(run.origin.metadata, Some(serde_json::json!({"i": i})));
            assert_eq!(run.owner, "lia");
            assert_eq!(
                run.status,
                if i == 3 {
                    RunStatus::Running
                } else {
                    RunStatus::Queued
                }
            );
        }
        ids.extend(page.runs.into_iter().map(|r| r.run_id));
        if page.next.is_none() {
            break;
        }
        after = page.next;
    }
    let expected: Vec<String> = (0..7).rev().map(|i| format!("run_ls_{i}")).collect();
    assert_eq!(ids, expected);
    // A span of creation times: `since` inclusive, `until` exclusive, paged within it.
    let span = |after: Option<RunPosition>| RunQuery {
        after,
        since: Some(at + chrono::Duration::seconds(2)),
        until: Some(at + chrono::Duration::seconds(5)),
        limit: 2,
    };
    let first_page = store.list_runs("lia", &span(None)).await.unwrap();
    let ids: Vec<&str> = first_page.runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["run_ls_4", "run_ls_3"]);
    let rest = store
        .list_runs("lia", &span(first_page.next))
        .await
        .unwrap();
    let ids: Vec<&str> = rest.runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["run_ls_2"]);
    assert_eq!(rest.next, None);
    // The runs under a top-level run: its subagents at any depth, oldest first, paged; not
    // another root's.
    let (mut grandchild, first) = new_run("run_ls_grandchild", "lia");
    grandchild.origin.parent = Some(baton_core::run::ParentLink {
        run_id: "run_ls_child".into(),
        tool_call_id: "call_2".into(),
    });
    grandchild.origin.root_run_id = Some("run_ls_6".into());
    grandchild.origin.depth = 2;
    grandchild.created_at = at + chrono::Duration::seconds(31);
    store
        .create_run(&grandchild, &first, &[], None, None)
        .await
        .unwrap();
    let (mut elsewhere, first) = new_run("run_ls_elsewhere", "lia");
    elsewhere.origin.parent = Some(baton_core::run::ParentLink {
        run_id: "run_ls_5".into(),
        tool_call_id: "call_3".into(),
    });
    elsewhere.origin.root_run_id = Some("run_ls_5".into());
    elsewhere.origin.depth = 1;
    store
        .create_run(&elsewhere, &first, &[], None, None)
        .await
        .unwrap();
    let under = store.list_descendants("run_ls_6", None, 1).await.unwrap();
    assert_eq!(under.runs.len(), 1);
    assert_eq!(under.runs[0].run_id, "run_ls_child");
    let more = store
        .list_descendants("run_ls_6", under.next.as_ref(), 10)
        .await
        .unwrap();
    let ids: Vec<&str> = more.runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["run_ls_grandchild"]);
    assert_eq!(
        more.runs[0].origin.parent.as_ref().unwrap().run_id,
        "run_ls_child"
    );
    assert_eq!(more.next, None);
    let none = store.list_descendants("run_ls_0", None, 10).await.unwrap();
    assert_eq!(none, RunPage::default());
    let mo = store
        .list_runs("mo", &RunQuery::page(None, 10))
        .await
        .unwrap();
    assert_eq!(mo.runs.len(), 1);
    let nobody = store
        .list_runs("nobody", &RunQuery::page(None, 10))
        .await
        .unwrap();
    assert_eq!(nobody, RunPage::default());
}

/// Pages of CTAs: by owner or by top-level run (the run's own and its subagents'), of one
/// status or all, in order (by status, then oldest first), each page after the last one's
/// position, none skipped or repeated, and a position still good after its CTA moved on.
pub(super) async fn cta_pages_contract(store: Arc<dyn Store>) {
    let at = Utc::now() - chrono::Duration::hours(1);
    let (root_a, first) = new_run("run_pg_a", "paula");
    store
        .create_run(&root_a, &first, &[], None, None)
        .await
        .unwrap();
    let (mut child, first) = new_run("run_pg_c", "paula");
    child.origin.root_run_id = Some("run_pg_a".into());
    child.origin.depth = 1;
    store
        .create_run(&child, &first, &[], None, None)
        .await
        .unwrap();
    let (root_b, first) = new_run("run_pg_b", "paula");
    store
        .create_run(&root_b, &first, &[], None, None)
        .await
        .unwrap();
    let (other, first) = new_run("run_pg_o", "oscar");
    store
        .create_run(&other, &first, &[], None, None)
        .await
        .unwrap();
    // Raised in time order, interleaved across the runs: a_*, then c_*, then b_*.
    raise_ctas(&*store, root_a, "pa", 70, at).await;
    raise_ctas(&*store, child, "pc", 40, at + chrono::Duration::seconds(1)).await;
    raise_ctas(&*store, root_b, "pb", 50, at + chrono::Duration::seconds(2)).await;
    raise_ctas(&*store, other, "po", 5, at).await;
    // Ten of root A's are answered.
    for i in 0..10 {
        let settled = store
            .settle_cta(
                &format!("pa_{i:05}"),
                &Settlement::Answered {
                    response: CtaResponse::approval(true),
                    responder: None,
                    via: None,
                },
                Utc::now(),
            )
            .await
            .unwrap();
        assert!(matches!(settled, Settled::Won(_)));
    }
    let ids = |p: &str, r: std::ops::Range<usize>| -> Vec<String> {
        r.map(|i| format!("{p}_{i:05}")).collect()
    };
    let pending = [ids("pa", 10..70), ids("pc", 0..40), ids("pb", 0..50)].concat();
    let query = |status, root: Option<&str>, limit| CtaQuery {
        status,
        root_run_id: root.map(str::to_owned),
        after: None,
        limit,
    };
    assert_eq!(
        every_page(&*store, "paula", query(Some(CtaStatus::Pending), None, 50)).await,
        pending
    );
    assert_eq!(
        every_page(&*store, "paula", query(Some(CtaStatus::Pending), None, 7)).await,
        pending
    );
    // All statuses: by status name (answered before pending), oldest first in each.
    assert_eq!(
        every_page(&*store, "paula", query(None, None, 33)).await,
        [ids("pa", 0..10), pending.clone()].concat()
    );
    // Under root A: its own and its subagent's, not root B's nor another owner's.
    assert_eq!(
        every_page(
            &*store,
            "paula",
            query(Some(CtaStatus::Pending), Some("run_pg_a"), 25)
        )
        .await,
        [ids("pa", 10..70), ids("pc", 0..40)].concat()
    );
    assert_eq!(
        every_page(&*store, "paula", query(None, Some("run_pg_b"), 100)).await,
        ids("pb", 0..50)
    );
    assert!(
        every_page(&*store, "oscar", query(None, Some("run_pg_a"), 10))
            .await
            .is_empty()
    );
    // A page ends where asked; the next starts after its last CTA, even once that CTA has
    // been answered since.
    let mut q = query(Some(CtaStatus::Pending), None, 5);
    let page = store.list_ctas("paula", &q).await.unwrap();
    assert_eq!(
        page.iter().map(|c| c.cta_id.clone()).collect::<Vec<_>>(),
        ids("pa", 10..15)
    );
    q.after = Some(CtaPosition::of(&page[4]));
    store
        .settle_cta("pa_00014", &Settlement::Expired, Utc::now())
        .await
        .unwrap();
    let page = store.list_ctas("paula", &q).await.unwrap();
    assert_eq!(
        page.iter().map(|c| c.cta_id.clone()).collect::<Vec<_>>(),
        ids("pa", 15..20)
    );
}
