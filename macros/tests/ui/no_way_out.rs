sov_macros::machine!("no_way_out.toml", base = "source");

fn main() {}
