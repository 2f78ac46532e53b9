//! Everything that talks to the kernel's tracing machinery: BTF, tracefs, feature probes, the
//! attach policy shared by the loader and `doctor`, loading and attaching, generation maps.

pub mod btf;
pub mod features;
pub mod hooks;
pub mod loader;
pub mod maps;
pub mod proginfo;
pub mod tracefs;
