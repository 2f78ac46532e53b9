//! Everything between collected numbers and the user: histograms, typed rows, findings,
//! sanitising of names that come from outside, rendering, and the sinks reports go to.

pub mod findings;
pub mod group;
pub mod harm;
pub mod hist;
pub mod links;
pub mod output;
pub mod render;
pub mod rows;
pub mod sanitize;
pub mod schema;
pub mod table;
pub mod units;
pub mod who;
