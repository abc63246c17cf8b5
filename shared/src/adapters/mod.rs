pub mod aws;
pub mod dynamo;
pub mod eventbridge;
pub mod local;
pub mod provision;
pub mod scheduler;
pub mod sqs;
