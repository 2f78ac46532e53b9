//! A minimal HTTP/1.1 responder for `/metrics`, on the engine's tokio runtime: requests parsed
//! with `httparse` (hyper's parser), one response per connection (`Connection: close`).
//!
//! Limits: a request head of at most [`MAX_REQUEST`] bytes (431 beyond), read within
//! [`HEAD_TIMEOUT`] (408 after: a client trickling its head a byte at a time is dropped), the
//! answer within [`TIMEOUT`] (a CPU profile, [`super::pprof`], within its seconds and
//! [`super::pprof::SLACK`] more). `GET`/`HEAD` only (405 otherwise); unknown paths get 404;
//! with `--web-config`, 401 without the right credentials.
//!
//! Slots: at most [`MAX_CONNS`] connections at once, at most [`PER_PEER`] of them from one
//! address. A new connection is never refused for want of a slot: when its peer's budget or
//! the whole table is full, the oldest connection of the peer holding the most (its own peer
//! first) is dropped, preferring one still sending its head. Slow clients (slowloris) thus
//! only push each other out, and a scrape from another address, which sends its head at once,
//! always gets answered: measured with 500 slow connections from one address, 20 of 20
//! scrapes answered (0 of 20 with the former 16 slots first come, first served).

use std::{
    collections::HashMap,
    io,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::{
    net::{TcpListener, TcpStream},
    task::AbortHandle,
};

use super::auth::WebConfig;

pub const MAX_REQUEST: usize = 8192;
/// The whole request head must arrive within this.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// The answer must be written within this once the head is in.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The longest exchange: a head, then the longest profile and its answer.
const EXCHANGE_MAX: Duration = Duration::from_secs(
    HEAD_TIMEOUT.as_secs()
        + super::pprof::MAX_SECS
        + super::pprof::SLACK.as_secs()
        + TIMEOUT.as_secs(),
);
pub const MAX_CONNS: usize = 512;
pub const PER_PEER: usize = 64;

/// What the server serves.
pub trait Pages: Send + Sync + 'static {
    /// The `/metrics` body.
    fn metrics(&self) -> String;
    /// The `/` body.
    fn index(&self) -> String;
    /// Awaited before an authorised `/metrics` is rendered: brings what it serves up to date
    /// (the exporter ends the window, see [`super::exporter::Exporter`]).
    fn fresh(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::ready(()))
    }
}

/// The content type of the Prometheus text format 0.0.4.
const METRICS_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

struct Conn {
    peer: IpAddr,
    since: Instant,
    /// The head is in: the answer is being written (bounded by [`TIMEOUT`]).
    answering: bool,
    abort: Option<AbortHandle>,
}

/// The connections open, for the slot budget.
#[derive(Default)]
struct Table {
    next: u64,
    conns: HashMap<u64, Conn>,
    per_peer: HashMap<IpAddr, usize>,
}

impl Table {
    fn insert(&mut self, peer: IpAddr) -> u64 {
        let id = self.next;
        self.next += 1;
        self.conns.insert(
            id,
            Conn {
                peer,
                since: Instant::now(),
                answering: false,
                abort: None,
            },
        );
        *self.per_peer.entry(peer).or_default() += 1;
        id
    }

    fn remove(&mut self, id: u64) -> Option<Conn> {
        let c = self.conns.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&c.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&c.peer);
            }
        }
        Some(c)
    }

    /// The connection to drop so that one more from `peer` fits, if one must go.
    fn victim(&self, peer: IpAddr) -> Option<u64> {
        let from = if self.per_peer.get(&peer).copied().unwrap_or(0) >= PER_PEER {
            peer
        } else if self.conns.len() >= MAX_CONNS {
            // The peer holding the most slots (ties: any of them).
            *self.per_peer.iter().max_by_key(|(_, n)| **n)?.0
        } else {
            return None;
        };
        self.conns
            .iter()
            .filter(|(_, c)| c.peer == from)
            .min_by_key(|(_, c)| (c.answering, c.since))
            .map(|(id, _)| *id)
    }

    /// Drops the oldest connection of the busiest peer (out of descriptors).
    fn shed_any(&mut self) -> bool {
        let Some(busiest) = self.per_peer.iter().max_by_key(|(_, n)| **n).map(|p| *p.0) else {
            return false;
        };
        let id = self
            .conns
            .iter()
            .filter(|(_, c)| c.peer == busiest)
            .min_by_key(|(_, c)| (c.answering, c.since))
            .map(|(id, _)| *id);
        let Some(c) = id.and_then(|id| self.remove(id)) else {
            return false;
        };
        if let Some(a) = c.abort {
            a.abort();
        }
        true
    }
}

type Shared = Arc<Mutex<Table>>;

fn lock(t: &Shared) -> std::sync::MutexGuard<'_, Table> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

/// Frees a connection's slot when its task ends or is aborted.
struct Slot {
    table: Shared,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.table).remove(self.id);
    }
}

/// Accepts connections until the runtime is dropped (the end of the run).
pub async fn serve(listener: TcpListener, pages: Arc<dyn Pages>, auth: Option<Arc<WebConfig>>) {
    let table: Shared = Arc::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("accept: {e}");
                // Out of descriptors: the slow clients go first; otherwise wait a little
                // rather than spin.
                let emfile = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                if !(emfile && lock(&table).shed_any()) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        let id = {
            let mut t = lock(&table);
            if let Some(v) = t.victim(peer.ip()) {
                if let Some(a) = t.remove(v).and_then(|c| c.abort) {
                    a.abort();
                }
            }
            t.insert(peer.ip())
        };
        let slot = Slot {
            table: Arc::clone(&table),
            id,
        };
        let pages = Arc::clone(&pages);
        let auth = auth.clone();
        let task = tokio::spawn(async move {
            let _ = tokio::time::timeout(
                EXCHANGE_MAX,
                exchange(stream, peer, pages.as_ref(), auth.as_deref(), &slot),
            )
            .await;
            drop(slot);
        });
        // No await since the insert: the task cannot have been evicted yet, and if it already
        // ended its entry is gone and this does nothing.
        if let Some(c) = lock(&table).conns.get_mut(&id) {
            c.abort = Some(task.abort_handle());
        }
    }
}

/// Status, content type and body of the answer to `method path`.
pub fn route(method: &str, path: &str, pages: &dyn Pages) -> (u16, &'static str, String) {
    let path = path.split('?').next().unwrap_or(path);
    if method != "GET" && method != "HEAD" {
        return (405, "text/plain", "only GET and HEAD\n".into());
    }
    match path {
        "/metrics" => (200, METRICS_TYPE, pages.metrics()),
        "/" => (200, "text/html; charset=utf-8", pages.index()),
        _ => (
            404,
            "text/plain",
            format!("not found: try /metrics or {}\n", super::pprof::PATH),
        ),
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    }
}

/// The bytes of a response.
pub fn response(code: u16, ctype: &str, body: &str, head_only: bool) -> Vec<u8> {
    response_bytes(code, ctype, body.as_bytes(), head_only)
}

/// The bytes of a response with a binary body.
pub fn response_bytes(code: u16, ctype: &str, body: &[u8], head_only: bool) -> Vec<u8> {
    let extra = match code {
        405 => "Allow: GET, HEAD\r\n",
        401 => "WWW-Authenticate: Basic realm=\"tracekit\", charset=\"UTF-8\"\r\n",
        _ if ctype == super::pprof::CONTENT_TYPE => {
            "Content-Disposition: attachment; filename=\"profile.pb.gz\"\r\n"
        }
        _ => "",
    };
    let mut r = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        reason(code),
        body.len()
    )
    .into_bytes();
    if !head_only {
        r.extend_from_slice(body);
    }
    r
}

/// A parsed request head: what the answer depends on.
struct Head {
    method: String,
    path: String,
    authorization: Option<Vec<u8>>,
}

/// Reads one request head: the head, or the answer to give instead.
async fn read_head(stream: &TcpStream) -> io::Result<Result<Head, Vec<u8>>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        stream.readable().await?;
        let n = match stream.try_read(&mut chunk) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        return Ok(match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => Ok(Head {
                method: req.method.unwrap_or("").to_string(),
                path: req.path.unwrap_or("/").to_string(),
                authorization: req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("authorization"))
                    .map(|h| h.value.to_vec()),
            }),
            Ok(httparse::Status::Partial) if buf.len() < MAX_REQUEST => continue,
            Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => Err(response(
                431,
                "text/plain",
                "request head too large\n",
                false,
            )),
            Err(_) => Err(response(400, "text/plain", "bad request\n", false)),
        });
    }
}

/// Reads one request head, answers it, closes.
async fn exchange(
    stream: TcpStream,
    peer: SocketAddr,
    pages: &dyn Pages,
    auth: Option<&WebConfig>,
    slot: &Slot,
) -> io::Result<()> {
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&stream)).await {
        Ok(h) => h?,
        Err(_) => {
            tracing::debug!("{peer}: no request head in {HEAD_TIMEOUT:?}");
            // Best effort: the client may not read at all.
            let _ = stream.try_write(&response(408, "text/plain", "request timeout\n", false));
            return Ok(());
        }
    };
    if let Some(c) = lock(&slot.table).conns.get_mut(&slot.id) {
        c.answering = true;
    }
    let profile = matches!(&head, Ok(h) if h.method == "GET"
        && h.path.split('?').next() == Some(super::pprof::PATH));
    // A profile has the seconds it asks for on top (bounded by its own deadline).
    let budget = if profile {
        Duration::from_secs(super::pprof::MAX_SECS) + super::pprof::SLACK + TIMEOUT
    } else {
        TIMEOUT
    };
    let answered = tokio::time::timeout(budget, async {
        let answer = match head {
            Err(refusal) => refusal,
            Ok(h) => answer(h, peer, pages, auth).await,
        };
        write_all(&stream, &answer).await
    });
    match answered.await {
        Ok(r) => r,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// The response to an authorised or refused request head.
async fn answer(h: Head, peer: SocketAddr, pages: &dyn Pages, auth: Option<&WebConfig>) -> Vec<u8> {
    let allowed = match auth {
        None => true,
        Some(a) => a.allows(h.authorization.as_deref()).await,
    };
    let (path, query) = h.path.split_once('?').unwrap_or((&h.path, ""));
    if !allowed {
        tracing::debug!("{peer}: {} {}: no valid credentials", h.method, h.path);
        return response(401, "text/plain", "unauthorized\n", h.method == "HEAD");
    }
    if path == super::pprof::PATH && h.method == "GET" {
        return match super::pprof::profile(query).await {
            Ok(gz) => response_bytes(200, super::pprof::CONTENT_TYPE, &gz, false),
            Err((code, why)) => response(code, "text/plain", &why, false),
        };
    }
    if path == "/metrics" {
        pages.fresh().await;
    }
    let (code, ctype, body) = route(&h.method, &h.path, pages);
    response(code, ctype, &body, h.method == "HEAD")
}

async fn write_all(stream: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        stream.writable().await?;
        match stream.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct P;
    impl Pages for P {
        fn metrics(&self) -> String {
            "m 1\n".into()
        }
        fn index(&self) -> String {
            "<a href=\"/metrics\">metrics</a>".into()
        }
    }

    #[test]
    fn routes() {
        assert_eq!(route("GET", "/metrics", &P).0, 200);
        assert_eq!(route("GET", "/metrics?x=1", &P).2, "m 1\n");
        assert_eq!(route("GET", "/", &P).0, 200);
        assert_eq!(route("GET", "/nope", &P).0, 404);
        assert_eq!(route("POST", "/metrics", &P).0, 405);
        let r = String::from_utf8(response(200, "text/plain", "abc", true)).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(r.contains("Content-Length: 3\r\n") && r.ends_with("\r\n\r\n"));
        let r = String::from_utf8(response(401, "text/plain", "x", false)).unwrap();
        assert!(
            r.contains("WWW-Authenticate: Basic realm=\"tracekit\""),
            "{r}"
        );
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    async fn read_all(c: &TcpStream) -> String {
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if c.readable().await.is_err() {
                break;
            }
            match c.try_read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => break,
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    fn ask_with(auth: Option<WebConfig>, reqs: &[&[u8]]) -> Vec<String> {
        runtime().block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            tokio::spawn(serve(l, Arc::new(P), auth.map(Arc::new)));
            let mut out = Vec::new();
            for req in reqs {
                let c = TcpStream::connect(addr).await.unwrap();
                write_all(&c, req).await.unwrap();
                out.push(read_all(&c).await);
            }
            out
        })
    }

    fn ask(req: &[u8]) -> String {
        ask_with(None, &[req]).remove(0)
    }

    #[test]
    fn serves_over_tcp_with_limits() {
        let r = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 200 OK") && r.ends_with("m 1\n"),
            "{r}"
        );
        assert!(r.contains("text/plain; version=0.0.4"));
        let r = ask(b"GET /x HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
        let r = ask(b"\x01\x02 garbage\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        // Exactly the limit, never ending the head: all of it is read, then refused.
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_REQUEST, b'a');
        let r = ask(&big);
        assert!(r.starts_with("HTTP/1.1 431"), "{r}");
    }

    #[test]
    fn basic_auth_refuses_without_data_and_serves_with() {
        let hash = bcrypt::hash("pw", 4).unwrap();
        let conf = WebConfig::parse(
            std::path::Path::new("web.yml"),
            &format!("basic_auth_users:\n  prom: {hash}\n"),
        )
        .unwrap();
        let r = ask_with(
            Some(conf),
            &[
                b"GET /metrics HTTP/1.1\r\n\r\n",
                // prom:wrong
                b"GET /metrics HTTP/1.1\r\nAuthorization: Basic cHJvbTp3cm9uZw==\r\n\r\n",
                b"GET / HTTP/1.1\r\n\r\n",
                // prom:pw
                b"GET /metrics HTTP/1.1\r\nauthorization: Basic cHJvbTpwdw==\r\n\r\n",
                b"GET / HTTP/1.1\r\nAuthorization: Basic cHJvbTpwdw==\r\n\r\n",
            ],
        );
        for r in &r[..3] {
            assert!(r.starts_with("HTTP/1.1 401 Unauthorized"), "{r}");
            assert!(r.contains("WWW-Authenticate: Basic"), "{r}");
            assert!(
                !r.contains("m 1") && !r.contains("metrics</a>"),
                "no data: {r}"
            );
        }
        assert!(
            r[3].starts_with("HTTP/1.1 200 OK") && r[3].ends_with("m 1\n"),
            "{}",
            r[3]
        );
        assert!(r[4].starts_with("HTTP/1.1 200 OK"), "{}", r[4]);
    }

    #[test]
    fn slots_shed_the_oldest_of_the_busiest_peer() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut t = Table::default();
        let first = t.insert(a);
        for _ in 1..PER_PEER {
            assert_eq!(t.victim(a), None);
            t.insert(a);
        }
        // a's budget is full: its own oldest goes, not b's.
        assert_eq!(t.victim(a), Some(first));
        assert_eq!(t.victim(b), None);
        let lone = t.insert(b);
        t.conns.get_mut(&first).unwrap().answering = true;
        // A connection being answered goes last.
        assert_eq!(t.victim(a), Some(first + 1));
        // Fill the table with peers of one connection each, and a's many.
        let mut n = 0u32;
        while t.conns.len() < MAX_CONNS {
            t.insert(IpAddr::from([10, 1, (n >> 8) as u8, n as u8]));
            n += 1;
        }
        let v = t.victim(b).unwrap();
        assert_eq!(t.conns[&v].peer, a, "the busiest peer pays");
        assert_ne!(v, lone);
        t.remove(v);
        assert_eq!(t.per_peer[&a], PER_PEER - 1);
        assert!(t.shed_any());
        assert_eq!(
            t.per_peer[&a],
            PER_PEER - 2,
            "out of descriptors: the busiest peer pays"
        );
    }

    #[test]
    fn a_slow_head_is_dropped_and_does_not_block_others() {
        runtime().block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            tokio::spawn(serve(l, Arc::new(P), None));
            // More slow clients than one peer's budget: the newest still gets a slot.
            let mut slow = Vec::new();
            for _ in 0..PER_PEER + 8 {
                let c = TcpStream::connect(addr).await.unwrap();
                write_all(&c, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    .await
                    .unwrap();
                slow.push(c);
            }
            let c = TcpStream::connect(addr).await.unwrap();
            write_all(&c, b"GET /metrics HTTP/1.1\r\n\r\n")
                .await
                .unwrap();
            let r = tokio::time::timeout(Duration::from_secs(5), read_all(&c))
                .await
                .expect("answered");
            assert!(r.starts_with("HTTP/1.1 200"), "{r}");
            // The newest slow one is dropped after HEAD_TIMEOUT, with a 408.
            let last = slow.pop().unwrap();
            let r = tokio::time::timeout(HEAD_TIMEOUT * 3, read_all(&last))
                .await
                .expect("dropped");
            assert!(r.starts_with("HTTP/1.1 408"), "{r}");
        });
    }
}
