//! The hostile node cases (tests/hostile.rs on the host, tests/hostile_vm.rs in the
//! tests/vm guest): the cases, their requests and the sandbox they run in.

pub mod node_cases;
pub mod requests;
pub mod sandbox;
