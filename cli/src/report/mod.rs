//! Everything between collected numbers and the user: typed rows, findings, and (after the
//! collector kit lands whole) rendering, output sinks, histograms and sanitising.

pub mod findings;
pub mod rows;
