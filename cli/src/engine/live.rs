//! The live view (`--top`): an [`Emitter`] of the same run loop as every other output. Each
//! window it redraws, full screen, the title, notes and first [`Section`] of every collector's
//! [`Output`] (so any tool can offer `--top`), sorted by a column the tool declared sortable
//! (`rows::Column::sort`). Keys arrive through [`Emitter::input`]: a column's hotkey, `s`/Tab/→
//! for the next sortable column, `p`/space to pause the display (collection goes on, so the
//! kernel's maps never fill), `q`/Esc/Ctrl-C to quit.
//!
//! The terminal is restored on every exit path: at [`Emitter::finish`], and on drop (an error,
//! or the terminal going away). When the terminal goes away (a closed tmux pane, a dropped ssh
//! session) no SIGHUP reaches a process in its shell's group, and reads from it spin on EOF, so
//! a hang-up or EOF on stdin ends the run like `q`.
//!
//! [`Section`]: crate::report::rows::Section

use std::{
    future::Future,
    io::Stdout,
    os::fd::{AsRawFd, RawFd},
    pin::Pin,
    time::{Duration, SystemTime},
};

use ratatui::{
    backend::CrosstermBackend,
    crossterm::{cursor, execute, terminal},
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Cell, Paragraph, Row, Table as TTable},
    Terminal,
};
use tokio::io::{unix::AsyncFd, Interest};

use super::{collector::Meta, emit::Emitter, scope::RunOpts, Window};
use crate::{
    error::{Error, Result},
    report::{render::Output, table::Table},
};

/// What the view shows of one collector: the last window's title, notes, first table and
/// finding summaries.
#[derive(Clone, Debug, Default)]
struct View {
    title: String,
    notes: Vec<String>,
    table: Table,
    findings: Vec<String>,
}

impl View {
    fn of(o: &Output) -> View {
        View {
            title: o.title.clone(),
            notes: o.notes.clone(),
            table: o
                .sections
                .first()
                .map(|s| s.table.clone())
                .unwrap_or_default(),
            findings: o.findings.iter().map(|f| f.summary.clone()).collect(),
        }
    }

    /// Row indices in display order: by the sort column with `hotkey`, largest first, ties in
    /// the tool's order; the tool's order when the table has no such column.
    fn order(&self, hotkey: Option<char>) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..self.table.rows.len()).collect();
        if let Some(col) = hotkey.and_then(|h| self.table.sort.iter().find(|s| s.hotkey == h)) {
            idx.sort_by(|&a, &b| {
                let key = |i: usize| col.keys.get(i).copied().unwrap_or(f64::NEG_INFINITY);
                key(b).total_cmp(&key(a)).then(a.cmp(&b))
            });
        }
        idx
    }
}

/// What a key asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Quit,
    NextSort,
    Pause,
    Sort(char),
}

/// The keys in raw terminal bytes (arrow keys and other escape sequences arrive as `ESC [ …`;
/// a lone ESC quits).
fn keys(bytes: &[u8]) -> Vec<Key> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        i += 1;
        match b {
            0x1b if bytes.get(i) == Some(&b'[') || bytes.get(i) == Some(&b'O') => {
                // A CSI/SS3 sequence: its final byte is in 0x40..=0x7e.
                let start = i + 1;
                let end = bytes[start.min(bytes.len())..]
                    .iter()
                    .position(|c| (0x40..=0x7e).contains(c))
                    .map_or(bytes.len(), |p| start + p + 1);
                if bytes.get(end.wrapping_sub(1)) == Some(&b'C') {
                    out.push(Key::NextSort);
                }
                i = end;
            }
            0x1b | 0x03 | 0x04 | b'q' | b'Q' => out.push(Key::Quit),
            b'\t' | b's' => out.push(Key::NextSort),
            b'p' | b' ' => out.push(Key::Pause),
            c if c.is_ascii_graphic() => out.push(Key::Sort(c as char)),
            _ => {}
        }
    }
    out
}

struct Stdin(RawFd);
impl AsRawFd for Stdin {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// The live view: see the module documentation.
pub struct Live {
    /// Rows shown per collector (0: as many as fit).
    limit: usize,
    term: Option<Terminal<CrosstermBackend<Stdout>>>,
    stdin: Option<AsyncFd<Stdin>>,
    header: String,
    views: Vec<View>,
    /// The selected sort column's hotkey (None: the tool's order).
    sort: Option<char>,
    paused: bool,
}

impl Live {
    pub fn new(limit: usize) -> Live {
        Live {
            limit,
            term: None,
            stdin: None,
            header: String::new(),
            views: Vec::new(),
            sort: None,
            paused: false,
        }
    }

    fn restore(&mut self) {
        if self.term.take().is_some() {
            let _ = terminal::disable_raw_mode();
            let _ = execute!(
                std::io::stdout(),
                terminal::LeaveAlternateScreen,
                cursor::Show
            );
        }
        self.stdin = None;
    }

    /// The sortable columns of the first table (hotkey, header), in column order.
    fn sortable(&self) -> Vec<(char, String)> {
        self.views
            .first()
            .map(|v| {
                v.table
                    .sort
                    .iter()
                    .map(|s| {
                        let head = v.table.columns.get(s.column).map(|c| c.0.clone());
                        (s.hotkey, head.unwrap_or_default())
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn apply(&mut self, k: Key) -> bool {
        let sortable = self.sortable();
        match k {
            Key::Quit => return true,
            Key::Pause => self.paused = !self.paused,
            Key::NextSort if !sortable.is_empty() => {
                let at = sortable.iter().position(|(h, _)| Some(*h) == self.sort);
                self.sort = Some(sortable[at.map_or(0, |i| (i + 1) % sortable.len())].0);
            }
            Key::Sort(c) if sortable.iter().any(|(h, _)| *h == c) => self.sort = Some(c),
            _ => {}
        }
        false
    }

    fn status(&self) -> String {
        let sortable = self.sortable();
        let hot: Vec<String> = sortable.iter().map(|(h, _)| h.to_string()).collect();
        let names: Vec<&str> = sortable.iter().map(|(_, n)| n.as_str()).collect();
        let current = sortable
            .iter()
            .find(|(h, _)| Some(*h) == self.sort)
            .map_or("as reported", |(_, n)| n.as_str());
        format!(
            "sort: {current}  [s/Tab] next column  [{}] {}  [p] {}  [q] quit{}",
            hot.join("/"),
            names.join("/"),
            if self.paused { "resume" } else { "pause" },
            if self.paused { "   PAUSED" } else { "" }
        )
    }

    /// Redraws everything; a terminal that cannot be written any more is left alone (the next
    /// input wait sees it gone).
    fn draw(&mut self) {
        let status = self.status();
        let Some(term) = self.term.as_mut() else {
            return;
        };
        let (views, header, sort, limit) = (&self.views, &self.header, self.sort, self.limit);
        let _ = term.draw(|f| {
            let n = views.len().max(1) as u32;
            let mut areas = vec![Constraint::Length(1)];
            areas.extend(std::iter::repeat_n(Constraint::Ratio(1, n), n as usize));
            areas.push(Constraint::Length(1));
            let parts = Layout::vertical(areas).split(f.area());
            f.render_widget(Paragraph::new(header.as_str()), parts[0]);
            for (i, v) in views.iter().enumerate() {
                let mut lines: Vec<Line> = vec![Line::from(v.title.as_str())];
                lines.extend(v.notes.iter().map(|s| Line::from(s.as_str())));
                let fl = v.findings.len().min(2);
                let [top, mid, bottom] = Layout::vertical([
                    Constraint::Length(lines.len() as u16),
                    Constraint::Min(3),
                    Constraint::Length(fl as u16),
                ])
                .areas(parts[i + 1]);
                f.render_widget(Paragraph::new(lines), top);
                f.render_widget(table_widget(&v.table, &v.order(sort), sort, limit), mid);
                let fs: Vec<Line> = v.findings[..fl]
                    .iter()
                    .map(|s| Line::from(format!("! {s}")))
                    .collect();
                f.render_widget(Paragraph::new(fs), bottom);
            }
            f.render_widget(Paragraph::new(status.as_str()), parts[parts.len() - 1]);
        });
    }
}

/// A ratatui table of `t`'s rows in `order`, the sort column marked.
fn table_widget<'a>(t: &'a Table, order: &[usize], sort: Option<char>, limit: usize) -> TTable<'a> {
    let marked = sort.and_then(|h| t.sort.iter().find(|s| s.hotkey == h).map(|s| s.column));
    let shown: Vec<&Vec<String>> = order
        .iter()
        .take(if limit == 0 { usize::MAX } else { limit })
        .filter_map(|&i| t.rows.get(i))
        .collect();
    let ncols = t.columns.len();
    let widths: Vec<Constraint> = (0..ncols)
        .map(|c| {
            let w = shown
                .iter()
                .map(|r| r.get(c).map_or(0, |x| x.chars().count()))
                .chain([t.columns[c].0.chars().count() + 1])
                .max()
                .unwrap_or(1);
            if c + 1 == ncols {
                Constraint::Min(w as u16)
            } else {
                Constraint::Length(w as u16)
            }
        })
        .collect();
    let head: Vec<Cell> = t
        .columns
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            if Some(i) == marked {
                Cell::from(format!("{name}▼"))
                    .style(Style::default().add_modifier(Modifier::REVERSED))
            } else {
                Cell::from(name.as_str())
            }
        })
        .collect();
    let body: Vec<Row> = shown
        .into_iter()
        .map(|r| Row::new(r.iter().map(|c| Cell::from(c.as_str()))))
        .collect();
    TTable::new(body, widths)
        .header(Row::new(head).style(Style::default().add_modifier(Modifier::BOLD)))
}

impl Drop for Live {
    fn drop(&mut self) {
        self.restore();
    }
}

impl Emitter for Live {
    fn begin(&mut self, metas: &[Meta], opts: &RunOpts) -> Result<bool> {
        let io = |what: &str| {
            let what = what.to_string();
            move |source: std::io::Error| Error::Io { what, source }
        };
        terminal::enable_raw_mode().map_err(io("putting the terminal in raw mode"))?;
        // From here on, drop restores the terminal.
        let backend = CrosstermBackend::new(std::io::stdout());
        self.term = Some(Terminal::new(backend).map_err(io("opening the terminal"))?);
        execute!(std::io::stdout(), terminal::EnterAlternateScreen)
            .map_err(io("switching to the alternate screen"))?;
        // SAFETY: stdin stays open for the life of the process, so longer than the registration.
        let fd = unsafe {
            AsyncFd::register_with_interest(Stdin(libc::STDIN_FILENO), Interest::READABLE)
        };
        self.stdin = Some(fd.map_err(|e| Error::Io {
            what: "watching the terminal for keys".into(),
            source: std::io::Error::other(e.to_string()),
        })?);
        let every = opts.interval.unwrap_or(Duration::from_secs(1));
        let what: Vec<String> = metas
            .iter()
            .map(|m| format!("{} --top: {} ({})", m.tool, m.scope, m.programs_text))
            .collect();
        self.header = format!(
            "{}, every {}",
            what.join("; "),
            humantime::format_duration(every)
        );
        self.views = metas
            .iter()
            .map(|m| View {
                title: format!(
                    "{}: collecting the first {}…",
                    m.tool,
                    humantime::format_duration(every)
                ),
                ..View::default()
            })
            .collect();
        self.draw();
        Ok(true)
    }

    fn window(&mut self, _w: &Window, outs: &[Output]) -> Result<bool> {
        if !self.paused {
            self.views = outs.iter().map(View::of).collect();
            if self.sort.is_none() {
                self.sort = self.sortable().first().map(|s| s.0);
            }
            let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
            if let Some(i) = self.header.rfind("; at ") {
                self.header.truncate(i);
            }
            self.header.push_str(&format!("; at {now}"));
        }
        self.draw();
        Ok(true)
    }

    fn finish(&mut self) -> Result<()> {
        self.restore();
        Ok(())
    }

    fn input(&mut self) -> Pin<Box<dyn Future<Output = bool> + '_>> {
        Box::pin(async move {
            let Some(fd) = self.stdin.as_ref() else {
                return std::future::pending().await;
            };
            match fd.readable().await {
                Ok(mut g) => g.clear_ready(),
                Err(_) => return true,
            }
            let mut pfd = libc::pollfd {
                fd: libc::STDIN_FILENO,
                events: libc::POLLIN,
                revents: 0,
            };
            let mut quit = false;
            let mut redraw = false;
            // Everything the terminal holds now: one read may bring several keys.
            loop {
                // SAFETY: one valid pollfd, no timeout.
                let n = unsafe { libc::poll(&mut pfd, 1, 0) };
                if n <= 0 {
                    break;
                }
                if pfd.revents & libc::POLLIN == 0 {
                    // POLLHUP, POLLERR, POLLNVAL: the terminal went away.
                    return true;
                }
                let mut buf = [0u8; 64];
                // SAFETY: reads into a local buffer; poll said it will not block.
                let r = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), 64) };
                if r <= 0 {
                    // EOF or an error (EIO on a hung-up terminal).
                    return true;
                }
                for k in keys(&buf[..r as usize]) {
                    quit |= self.apply(k);
                    redraw = true;
                }
            }
            if redraw && !quit {
                self.draw();
            }
            quit
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::table::{Align, SortCol};

    #[test]
    fn keys_from_terminal_bytes() {
        assert_eq!(keys(b"q"), [Key::Quit]);
        assert_eq!(keys(b"\x03"), [Key::Quit]);
        assert_eq!(keys(b"\x1b"), [Key::Quit]);
        assert_eq!(keys(b"\x1b[C"), [Key::NextSort]);
        assert_eq!(keys(b"\x1b[A\x1b[1;5B"), []);
        assert_eq!(
            keys(b"\ti p"),
            [Key::NextSort, Key::Sort('i'), Key::Pause, Key::Pause]
        );
        assert_eq!(keys(b"\x1b["), []);
    }

    fn view() -> View {
        let mut t = Table::new(&[("PID", Align::Right), ("A", Align::Right)]);
        for (p, a) in [("1", "5"), ("2", "9"), ("3", "5")] {
            t.push(vec![p.into(), a.into()]);
        }
        t.sort.push(SortCol {
            column: 1,
            hotkey: 'a',
            keys: vec![5.0, 9.0, 5.0],
        });
        View {
            table: t,
            ..View::default()
        }
    }

    #[test]
    fn sorts_by_the_selected_column_ties_in_tool_order() {
        let v = view();
        assert_eq!(v.order(Some('a')), [1, 0, 2]);
        assert_eq!(v.order(None), [0, 1, 2]);
        assert_eq!(v.order(Some('z')), [0, 1, 2]);
    }

    #[test]
    fn keys_select_cycle_pause_and_quit() {
        let mut l = Live::new(0);
        l.views = vec![view()];
        assert!(!l.apply(Key::NextSort));
        assert_eq!(l.sort, Some('a'));
        assert!(!l.apply(Key::Sort('x')));
        assert_eq!(l.sort, Some('a'));
        assert!(!l.apply(Key::Pause));
        assert!(l.status().ends_with("PAUSED"), "{}", l.status());
        assert!(l.status().starts_with("sort: A "), "{}", l.status());
        assert!(l.apply(Key::Quit));
    }
}
