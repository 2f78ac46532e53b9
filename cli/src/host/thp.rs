//! Transparent huge page settings from `/sys/kernel/mm/transparent_hugepage`: what memstall's
//! findings cite and triage checks. Absent files (a kernel without THP, or an older layout) are
//! `None`, never an error.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{read_trim, selected, sys_path};

/// THP settings; `None` where a file is missing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ThpSettings {
    pub enabled: Option<String>,
    pub defrag: Option<String>,
    /// `khugepaged/defrag`: 1 lets khugepaged compact/reclaim to get a huge page.
    pub khugepaged_defrag: Option<String>,
    pub scan_sleep_ms: Option<u64>,
    pub pages_to_scan: Option<u64>,
}

impl ThpSettings {
    pub fn dir() -> PathBuf {
        sys_path("kernel/mm/transparent_hugepage")
    }

    pub fn read() -> ThpSettings {
        ThpSettings::read_from(&Self::dir())
    }

    pub fn read_from(dir: &Path) -> ThpSettings {
        let get = |f: &str| read_trim(&dir.join(f));
        let num = |f: &str| get(f).and_then(|s| s.parse().ok());
        ThpSettings {
            enabled: get("enabled").and_then(|s| selected(&s)),
            defrag: get("defrag").and_then(|s| selected(&s)),
            khugepaged_defrag: get("khugepaged/defrag").and_then(|s| selected(&s)),
            scan_sleep_ms: num("khugepaged/scan_sleep_millisecs"),
            pages_to_scan: num("khugepaged/pages_to_scan"),
        }
    }

    /// One line, `?` for what is missing.
    pub fn text(&self) -> String {
        let s = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
        let n = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_else(|| "?".into());
        format!(
            "enabled={} defrag={} khugepaged/defrag={} khugepaged/scan_sleep_millisecs={} khugepaged/pages_to_scan={}",
            s(&self.enabled),
            s(&self.defrag),
            s(&self.khugepaged_defrag),
            n(self.scan_sleep_ms),
            n(self.pages_to_scan)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fixture_trees() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/memstall");
        let a = ThpSettings::read_from(&dir.join("thp-always"));
        assert_eq!(a.enabled.as_deref(), Some("always"));
        assert_eq!(a.defrag.as_deref(), Some("always"));
        let m = ThpSettings::read_from(&dir.join("thp-madvise"));
        assert_eq!(m.defrag.as_deref(), Some("defer+madvise"));
        assert!(m.text().contains(" defrag=defer+madvise "));
        let none = ThpSettings::read_from(Path::new("/nonexistent"));
        assert_eq!(none, ThpSettings::default());
        assert!(none.text().starts_with("enabled=? defrag=?"));
    }
}
