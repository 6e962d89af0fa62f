//! Criterion benchmarks of backstop's layers next to tower's, in one run:
//! `cargo bench -p backstop-benches`. The crate has no library code; see `benches/`.
