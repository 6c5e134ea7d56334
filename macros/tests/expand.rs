//! The macros expand the repository's real specs into code that compiles and behaves: a smoke
//! test of the macro crate itself (the full behaviour tests live in runtime/src/scheduler/).

pub mod rt {
    sov_macros::interface!("../specs/runtime.toml");

    pub mod seed {
        sov_macros::machine!("../specs/scheduler.toml");
    }

    pub mod laptop {
        sov_macros::machine!("../specs/laptop.toml", interface = super);
    }
}

use rt::{Machine, PowerState, Slots};

#[test]
fn generated_items_exist_and_agree_with_the_spec() {
    assert_eq!(rt::seed::NAME, "seed");
    assert_eq!(rt::seed::CHECKPOINT_EVERY, 64);
    assert_eq!(rt::laptop::CHECKPOINT_EVERY, 16);
    assert_eq!(
        <rt::seed::Scheduler as Machine>::constant("block_size"),
        Some(16)
    );
    assert_eq!(<rt::seed::Scheduler as Machine>::constant("nope"), None);
    assert_ne!(rt::seed::SPEC_DIGEST, rt::laptop::SPEC_DIGEST);
    assert!(rt::seed::MERMAID.starts_with("stateDiagram-v2"));
    let slots = Slots::new();
    slots.set_by_name("power_state", "suspend").unwrap();
    assert_eq!(slots.power_state(), PowerState::Suspend);
    assert_eq!(slots.word(5), Some(1));
    let m = rt::seed::Scheduler::new();
    assert_eq!(m.state_name(), "idle");
}
