// The good fixture expands and runs: a machine stepping on a recording runtime.
mod rt {
    sov_macros::interface!("iface.toml", base = "source");

    pub mod mini {
        sov_macros::machine!("ok.toml", base = "source");
    }
}

use rt::Machine;

struct Rt;

impl rt::Actions for Rt {
    type Error = std::io::Error;
    fn work(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
    fn save(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl rt::Guards for Rt {
    fn busy(&self) -> bool {
        true
    }
}

fn main() {
    let slots = rt::Slots::new();
    slots.set_queue(1);
    let mut m = rt::mini::Scheduler::new();
    let t = m.step(&mut Rt, &slots).unwrap();
    assert_eq!(
        (t.from, t.to),
        (rt::mini::State::Idle, rt::mini::State::Run)
    );
    let t = m.step(&mut Rt, &slots).unwrap();
    assert_eq!(t.actions, vec![rt::Action::Work]);
    assert_eq!(slots.steps(), 1);
}
