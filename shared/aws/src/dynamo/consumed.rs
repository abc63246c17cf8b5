//! What DynamoDB itself says each call consumed: every call the store makes asks for
//! `ReturnConsumedCapacity=TOTAL`, and the units each answer names (its indexes' writes
//! included, which no estimate from item sizes sees) are added to the meter. One
//! interceptor on the store's client, so no call can be left out.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::config::interceptors::{
    AfterDeserializationInterceptorContextRef, BeforeSerializationInterceptorContextMut,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::operation::{
    batch_get_item::{BatchGetItemInput, BatchGetItemOutput},
    batch_write_item::{BatchWriteItemInput, BatchWriteItemOutput},
    get_item::{GetItemInput, GetItemOutput},
    put_item::{PutItemInput, PutItemOutput},
    query::{QueryInput, QueryOutput},
    transact_write_items::{TransactWriteItemsInput, TransactWriteItemsOutput},
    update_item::{UpdateItemInput, UpdateItemOutput},
};
use aws_sdk_dynamodb::types::{ConsumedCapacity, ReturnConsumedCapacity};

use crate::sdk::Meter;

/// Adds each answer's consumed units to a meter.
#[derive(Debug)]
pub struct ConsumedUnits(pub Arc<Meter>);

/// Thousandths of a unit, as the meter keeps them.
fn milli(c: &ConsumedCapacity) -> (u64, u64) {
    let m = |v: Option<f64>| (v.unwrap_or(0.0) * 1000.0).round() as u64;
    // Some answers give the split, some only the total: a read's total is reads, a
    // write's writes (the caller knows which when the split is missing).
    (m(c.read_capacity_units()), m(c.write_capacity_units()))
}

impl ConsumedUnits {
    fn add<'a>(&self, consumed: impl IntoIterator<Item = &'a ConsumedCapacity>, writes: bool) {
        for c in consumed {
            let (mut read, mut write) = milli(c);
            if read == 0 && write == 0 {
                let total = (c.capacity_units().unwrap_or(0.0) * 1000.0).round() as u64;
                if writes { write = total } else { read = total }
            }
            self.0
                .consumed_read_milli
                .fetch_add(read, Ordering::Relaxed);
            self.0
                .consumed_write_milli
                .fetch_add(write, Ordering::Relaxed);
        }
    }
}

impl Intercept for ConsumedUnits {
    fn name(&self) -> &'static str {
        "ConsumedUnits"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let total = Some(ReturnConsumedCapacity::Total);
        let input = context.input_mut();
        if let Some(i) = input.downcast_mut::<GetItemInput>() {
            i.return_consumed_capacity = total;
        } else if let Some(i) = input.downcast_mut::<PutItemInput>() {
            i.return_consumed_capacity = total;
        } else if let Some(i) = input.downcast_mut::<UpdateItemInput>() {
            i.return_consumed_capacity = total;
        } else if let Some(i) = input.downcast_mut::<QueryInput>() {
            i.return_consumed_capacity = total;
        } else if let Some(i) = input.downcast_mut::<TransactWriteItemsInput>() {
            i.return_consumed_capacity = total;
        } else if let Some(i) = input.downcast_mut::<BatchWriteItemInput>() {
            i.return_consumed_capacity = total;
        } else if let Some(i) = input.downcast_mut::<BatchGetItemInput>() {
            i.return_consumed_capacity = total;
        }
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let Ok(out) = context.output_or_error() else {
            return Ok(());
        };
        if let Some(o) = out.downcast_ref::<GetItemOutput>() {
            self.add(o.consumed_capacity(), false);
        } else if let Some(o) = out.downcast_ref::<QueryOutput>() {
            self.add(o.consumed_capacity(), false);
        } else if let Some(o) = out.downcast_ref::<BatchGetItemOutput>() {
            self.add(o.consumed_capacity(), false);
        } else if let Some(o) = out.downcast_ref::<PutItemOutput>() {
            self.add(o.consumed_capacity(), true);
        } else if let Some(o) = out.downcast_ref::<UpdateItemOutput>() {
            self.add(o.consumed_capacity(), true);
        } else if let Some(o) = out.downcast_ref::<TransactWriteItemsOutput>() {
            let before = self.0.consumed_write_milli.load(Ordering::Relaxed);
            self.add(o.consumed_capacity(), true);
            // Apart too: DynamoDB bills a transaction's writes twice, and DynamoDB Local
            // reports them once, so what AWS would bill is the report plus this.
            let added = self.0.consumed_write_milli.load(Ordering::Relaxed) - before;
            self.0
                .consumed_transact_write_milli
                .fetch_add(added, Ordering::Relaxed);
        } else if let Some(o) = out.downcast_ref::<BatchWriteItemOutput>() {
            self.add(o.consumed_capacity(), true);
        }
        Ok(())
    }
}
