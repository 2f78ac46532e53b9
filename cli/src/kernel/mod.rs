//! Everything that talks to the kernel's tracing machinery: the attach policy (and, once the
//! collector kit lands whole, the loader, BTF, tracefs, feature probes and map helpers).

pub mod hooks;
pub mod maps;
