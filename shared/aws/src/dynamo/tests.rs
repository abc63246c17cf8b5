use super::*;
use baton_core::timeline::EntryBody;

fn store() -> DynamoStore {
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .build();
    DynamoStore::new(Client::from_conf(conf), "t", 90, Meter::shared())
}

pub(super) fn noise(seed: u64, len: usize) -> String {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'!' + (x % 90) as u8)
        })
        .collect()
}

#[test]
fn large_commits_split_into_items_under_the_limit() {
    let at = chrono::DateTime::from_timestamp(0, 0).unwrap_or_default();
    let entries: Vec<Entry> = (0..8)
        .map(|i| Entry {
            seq: i + 1,
            at,
            body: EntryBody::user(noise(i, 60_000)),
        })
        .collect();
    let items = store().segment_items("run_x", &entries).expect("splits");
    assert!(items.len() >= 2, "{} item(s)", items.len());
    assert!(items.iter().all(|i| item_size(i) < 400 * 1024));
    let total: usize = items
        .iter()
        .map(|i| get_s(i, "SK").map(|_| 1).unwrap_or(0))
        .sum();
    assert_eq!(total, items.len());
    let back = assemble(&items, &[], 9).expect("assembles");
    assert_eq!(back, entries);
    // A small commit stays one item; one entry over the limit is a clear error.
    assert_eq!(
        store()
            .segment_items("run_x", &entries[..1])
            .expect("fits")
            .len(),
        1
    );
    // One entry over the limit (a long final answer) is stored in parts and comes back
    // whole, also between other segments and under a patch of another entry.
    let huge = Entry {
        seq: 9,
        at,
        body: EntryBody::user(noise(1, 1_000_000)),
    };
    let parts = store()
        .segment_items("run_x", std::slice::from_ref(&huge))
        .expect("parts");
    assert_eq!(parts.len(), 3, "1 MB of noise in 390 KB parts");
    assert!(parts.iter().all(|i| item_size(i) < 400 * 1024));
    let mut all = items.clone();
    all.extend(parts);
    let back = assemble(&all, &[], 10).expect("assembles");
    assert_eq!(back.len(), 9);
    assert_eq!(back[8], huge);
    assert_eq!(back[..8], entries[..]);
}

#[test]
fn item_sizes_follow_dynamodb_rules() {
    let item = Item::from([("PK".into(), s("RUN#a")), ("v".into(), n(12345))]);
    assert_eq!(item_size(&item), 2 + 5 + 1 + 4);
}

#[test]
fn a_run_item_packs_its_body_and_outbox_and_format_1_items_still_read() {
    use baton_core::run::NewRun;
    let at = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default();
    let mut run = Run::new(NewRun {
        metadata: Some(serde_json::json!({"team": "a"})),
        ..NewRun::top_level("run_packed", "orchestrator", "o", at)
    });
    run.set_prompt("summarise the repository and ask before you change anything");
    let outbox = vec![Effect::Publish(baton_core::message::Event {
        id: "evt_1".into(),
        detail_type: "run.state".into(),
        detail: serde_json::json!({"runId": "run_packed", "status": "running"}),
        time: at,
    })];
    let item = store().run_item(&run, &outbox, 1).expect("encodes");
    // Format 2: bytes, smaller than the JSON format 1 wrote.
    let (Some(AttributeValue::B(body)), Some(AttributeValue::B(ob))) =
        (item.get("body"), item.get("ob"))
    else {
        panic!("body and outbox are not packed: {item:?}");
    };
    let mut lean = run.clone();
    lean.origin.metadata = None;
    let json = serde_json::to_string(&lean).expect("json");
    assert!(
        body.as_ref().len() < json.len() * 3 / 4,
        "{} of {}",
        body.as_ref().len(),
        json.len()
    );
    assert!(!ob.as_ref().is_empty());
    let back = parse_run(&item).expect("reads format 2");
    assert_eq!(back.run, lean);
    assert_eq!(back.outbox, outbox);
    // A run item format 1 wrote (JSON strings) reads the same.
    let mut old = item.clone();
    old.insert("body".into(), s(json));
    old.insert(
        "ob".into(),
        s(serde_json::to_string(&outbox).expect("json")),
    );
    let back = parse_run(&old).expect("reads format 1");
    assert_eq!(back.run, lean);
    assert_eq!(back.outbox, outbox);
}
