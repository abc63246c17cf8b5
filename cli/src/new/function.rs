//! The `{{function}}` Lambda function (template.yaml): Baton's, its catalog given this
//! project's tools, plugins and agents.

fn main() -> Result<(), baton_sdk::lambda::Error> {
    baton_sdk::lambda::main(baton_sdk::lambda::Role::{{role}}, {{tools}}::extensions())
}
