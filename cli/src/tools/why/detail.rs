//! `why --cpu` and `--detail`: the other tools' collectors run beside why in the same windows
//! and the same output, for what why's stacks cannot say (which file, which device and who else
//! issues to it, which memory stall, which functions).

use super::Args;
use crate::{
    engine::{Collector, Scope},
    tools::{self, OpenCtx},
};

/// The other tools `--cpu` and `--detail` run beside why, with the flags they get, and whether
/// each follows why's scope (io-lat does not: a device's other issuers are the point).
/// fsync-lat names the file of each call (`--by-file`), which why's stacks cannot.
fn companions(args: &Args) -> Vec<(&'static str, &'static [&'static str], bool)> {
    let mut v = Vec::new();
    if args.cpu {
        v.push(("profile", &[][..], true));
    }
    if args.detail {
        v.extend([
            ("fsync-lat", &["--by-file"][..], true),
            ("memstall", &[][..], true),
            ("io-lat", &[][..], false),
        ]);
    }
    v
}

/// Opens the companions `args` asks for; what could not run is said in `cannot` (why's notes),
/// never an error: why's own parts stand without them.
pub fn open(args: &Args, ctx: &OpenCtx, cannot: &mut Vec<String>) -> Vec<Box<dyn Collector>> {
    let mut all = Vec::new();
    for (tool, flags, scoped) in companions(args) {
        let node;
        let c = if scoped {
            ctx
        } else {
            let mut n = OpenCtx::new(Scope::default(), ctx.opts.clone());
            n.facts = ctx.facts.clone();
            node = n;
            &node
        };
        // Without its flags (fsync-lat's --by-file needs the kernel's BTF) it still times the
        // calls.
        let opened = match tools::open_with(tool, flags, c) {
            Some(Err(e)) if !flags.is_empty() => {
                cannot.push(format!(
                    "{tool} {} could not run beside it ({}); it runs without",
                    flags.join(" "),
                    crate::error::one_line(&e)
                ));
                tools::open_default(tool, c)
            }
            o => o,
        };
        match opened {
            Some(Ok(col)) => all.push(col),
            Some(Err(e)) => cannot.push(format!(
                "{tool} could not run beside it: {}",
                crate::error::one_line(&e)
            )),
            None => {}
        }
    }
    all
}
