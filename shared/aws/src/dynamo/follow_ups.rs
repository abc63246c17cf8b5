//! A run's waiting follow-ups on DynamoDB: the run item's `fw`, a map from each admitted
//! follow-up's message id to when it was admitted (ms since the epoch), or to null once
//! the run holds it in its queue. Its size is what the cap counts.

use super::*;

/// An `UpdateItem` of a run item's `fw` map.
struct Places<'a> {
    update: String,
    condition: &'a str,
    names: Vec<(String, String)>,
    values: Vec<(String, AttributeValue)>,
}

impl DynamoStore {
    /// Sets the places of `message_ids` to `to` (held: null), or removes them (`None`),
    /// where run `run_id` has waiting follow-ups.
    pub(super) async fn places(
        &self,
        run_id: &str,
        message_ids: &[String],
        to: Option<AttributeValue>,
    ) -> Result<(), PortError> {
        if message_ids.is_empty() {
            return Ok(());
        }
        let names: Vec<(String, String)> = message_ids
            .iter()
            .enumerate()
            .map(|(i, id)| (format!("#i{i}"), id.clone()))
            .collect();
        let paths = names.iter().map(|(k, _)| format!("fw.{k}"));
        let (update, values) = match to {
            Some(v) => (
                format!(
                    "SET {}",
                    paths
                        .map(|p| format!("{p} = :to"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                vec![(":to".to_owned(), v)],
            ),
            None => (
                format!("REMOVE {}", paths.collect::<Vec<_>>().join(", ")),
                vec![],
            ),
        };
        // None wait (or the run is gone): nothing to do.
        self.places_update(
            run_id,
            Places {
                update,
                condition: "attribute_exists(fw)",
                names,
                values,
            },
        )
        .await
        .map(|_| ())
    }

    /// One conditional `UpdateItem` of the run item: false if its condition failed.
    async fn places_update(&self, run_id: &str, p: Places<'_>) -> Result<bool, PortError> {
        Meter::count(&self.meter.dynamodb);
        self.meter
            .write_units
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("PK", s(run_pk(run_id)))
            .key("SK", s("META"))
            .update_expression(p.update)
            .condition_expression(p.condition);
        for (k, v) in p.names {
            req = req.expression_attribute_names(k, v);
        }
        for (k, v) in p.values {
            req = req.expression_attribute_values(k, v);
        }
        match req.send().await {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(false),
            Err(e) => Err(map_sdk_err("UpdateItem", e)),
        }
    }
}

#[async_trait::async_trait]
impl FollowUps for DynamoStore {
    async fn claim_turn(
        &self,
        run_id: &str,
        message_id: &str,
        at: DateTime<Utc>,
        stale: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        Meter::count(&self.meter.dynamodb);
        self.meter
            .write_units
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let claimed = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("PK", s(run_pk(run_id)))
            .key("SK", s("META"))
            .update_expression("SET tc = :m, tcat = :at")
            .condition_expression(
                "attribute_exists(PK) AND (attribute_not_exists(tc) OR tc = :m OR tcat < :stale)",
            )
            .expression_attribute_values(":m", s(message_id))
            .expression_attribute_values(":at", n(at.timestamp_millis()))
            .expression_attribute_values(":stale", n(stale.timestamp_millis()))
            .send()
            .await;
        match claimed {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(false),
            Err(e) => Err(map_sdk_err("UpdateItem", e)),
        }
    }

    /// Admits `message_id` to run `run_id`'s waiting follow-ups while fewer than `cap` wait
    /// (see `FollowUps::admit_follow_up`): into the map, or as the map's first entry; when it
    /// is full, the places of follow-ups admitted before `stale` and not held by the run
    /// are given back first (each only as it was read), and it is tried again.
    async fn admit_follow_up(
        &self,
        run_id: &str,
        message_id: &str,
        cap: usize,
        at: DateTime<Utc>,
        stale: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        let at = n(at.timestamp_millis());
        let member = vec![("#m".to_owned(), message_id.to_owned())];
        // Each round fails only if another write changed the map in between.
        for _ in 0..4 {
            let admitted = self
                .places_update(
                    run_id,
                    Places {
                        update: "SET fw.#m = if_not_exists(fw.#m, :at)".into(),
                        condition: "attribute_exists(fw) AND (size(fw) < :cap OR attribute_exists(fw.#m))",
                        names: member.clone(),
                        values: vec![(":at".into(), at.clone()), (":cap".into(), n(cap as i64))],
                    },
                )
                .await?;
            if admitted {
                return Ok(true);
            }
            let Some(item) = self.get_item(run_pk(run_id)).await? else {
                // The run is gone: nothing waits for it.
                return Ok(false);
            };
            let Some(AttributeValue::M(places)) = item.get("fw") else {
                // Its first follow-up: the map is made with it.
                let first = AttributeValue::M(HashMap::from([(message_id.to_owned(), at.clone())]));
                self.places_update(
                    run_id,
                    Places {
                        update: "SET fw = :first".into(),
                        condition: "attribute_exists(PK) AND attribute_not_exists(fw)",
                        names: vec![],
                        values: vec![(":first".into(), first)],
                    },
                )
                .await?;
                continue;
            };
            if places.len() < cap || places.contains_key(message_id) {
                // Not refused as read: the map changed in between (its first entry made by
                // a concurrent post, a place released). Tried again.
                continue;
            }
            let stale_ms = stale.timestamp_millis();
            let unsent: Vec<(&String, &AttributeValue)> = places
                .iter()
                .filter(|(_, v)| match v {
                    AttributeValue::N(ms) => ms.parse::<i64>().is_ok_and(|ms| ms < stale_ms),
                    _ => false,
                })
                .collect();
            if unsent.is_empty() {
                return Ok(false);
            }
            // Each given back only if it is still as read: admitted then, never held.
            let mut names = Vec::new();
            let mut values = Vec::new();
            let mut removes = Vec::new();
            let mut unchanged = Vec::new();
            for (i, (id, ms)) in unsent.into_iter().enumerate() {
                names.push((format!("#u{i}"), id.clone()));
                values.push((format!(":u{i}"), ms.clone()));
                removes.push(format!("fw.#u{i}"));
                unchanged.push(format!("fw.#u{i} = :u{i}"));
            }
            let condition = unchanged.join(" AND ");
            self.places_update(
                run_id,
                Places {
                    update: format!("REMOVE {}", removes.join(", ")),
                    condition: &condition,
                    names,
                    values,
                },
            )
            .await?;
        }
        Ok(false)
    }

    async fn release_follow_ups(
        &self,
        run_id: &str,
        message_ids: &[String],
    ) -> Result<(), PortError> {
        self.places(run_id, message_ids, None).await
    }

    async fn hold_follow_ups(&self, run_id: &str, message_ids: &[String]) -> Result<(), PortError> {
        self.places(run_id, message_ids, Some(AttributeValue::Null(true)))
            .await
    }
}
