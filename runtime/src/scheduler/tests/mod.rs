//! Tests of the generated schedulers: [`world`] is a recording runtime (a small model of queue,
//! batch and paged KV cache implementing the generated `Actions` and `Guards`), [`behaviour`]
//! replays the expected scenarios on both shipped machines, [`props`] drives them with random
//! slots and predicate answers.

mod behaviour;
mod props;
mod world;
