//! The `sov` command-line tool.

fn main() {
    println!("sov: work in progress");
}
