use super::*;
use baton_core::timeline::EntryBody;

fn store() -> DynamoStore {
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .build();
    DynamoStore::new(Client::from_conf(conf), "t", 90, Meter::shared())
}

fn noise(seed: u64, len: usize) -> String {
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
            body: EntryBody::User {
                text: noise(i, 60_000),
                message_id: None,
                options: Default::default(),
            },
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
    let back = assemble(&items, 9).expect("assembles");
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
        body: EntryBody::User {
            text: noise(1, 1_000_000),
            message_id: None,
            options: Default::default(),
        },
    };
    let parts = store()
        .segment_items("run_x", std::slice::from_ref(&huge))
        .expect("parts");
    assert_eq!(parts.len(), 3, "1 MB of noise in 390 KB parts");
    assert!(parts.iter().all(|i| item_size(i) < 400 * 1024));
    let mut all = items.clone();
    all.extend(parts);
    let back = assemble(&all, 10).expect("assembles");
    assert_eq!(back.len(), 9);
    assert_eq!(back[8], huge);
    assert_eq!(back[..8], entries[..]);
}

#[test]
fn item_sizes_follow_dynamodb_rules() {
    let item = Item::from([("PK".into(), s("RUN#a")), ("v".into(), n(12345))]);
    assert_eq!(item_size(&item), 2 + 5 + 1 + 4);
}
