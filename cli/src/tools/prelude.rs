//! The kit as a collector module sees it: `use crate::tools::prelude::*;`, then the tool's own
//! imports. Only names nearly every collector uses (engine, errors, loading, rows, registry).

pub use crate::{
    engine::{Collector, Meta, Output, Scope, Stats, Window},
    error::{Context as _, Error, Result},
    kernel::{
        hooks::{AttachMode, ForceMode, Hook},
        loader::{self, LoadSpec, Object, Session},
        maps::GenMap,
    },
    options::Common,
    report::rows::{id_columns, Column, Ctx, Section},
    tools::{self, row_comm, OpenCtx, ToolInfo},
};
