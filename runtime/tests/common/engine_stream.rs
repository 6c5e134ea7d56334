//! Reading a request's output stream from the public engine.

use std::sync::mpsc::Receiver;
use std::time::Duration;

use sov::engine::{Finished, Output};

/// The request's final accounting, once its stream ends (at most 300 s).
pub fn wait(rx: &Receiver<Output>) -> Finished {
    loop {
        let out = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("the request did not finish");
        if let Some(f) = out.finished {
            return f;
        }
    }
}
