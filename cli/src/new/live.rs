//! The `live` Lambda function (template.yaml): the authorizer of the live channel, Baton's.
//! It builds no catalog, so it links none of this project's tools.

fn main() -> Result<(), baton_sdk::lambda::Error> {
    baton_sdk::lambda::main(baton_sdk::lambda::Role::LiveAuthorizer, Default::default())
}
