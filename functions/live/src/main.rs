//! The `live` function: the authorizer of the live channel (the AppSync Events API the step
//! functions publish runs' live events to). A watcher connects and subscribes with the watch
//! token the `api` function granted it; this checks the token, and that the channel is the
//! token's run's. It reads nothing but its key.

fn main() -> Result<(), baton_lambda::Error> {
    baton_lambda::main(baton_lambda::Role::LiveAuthorizer, Default::default())
}
