//! A minimal HTTP/1.1 responder for `/metrics`, on the engine's tokio runtime: requests parsed
//! with `httparse` (hyper's parser), one response per connection (`Connection: close`).
//!
//! Limits: a request head of at most [`MAX_REQUEST`] bytes (431 beyond), [`TIMEOUT`] for a whole
//! exchange (a slow or idle client is dropped), at most [`MAX_CONNS`] connections at once (more
//! are closed at once). `GET`/`HEAD` only (405 otherwise); unknown paths get 404.

use std::{io, sync::Arc, time::Duration};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

pub const MAX_REQUEST: usize = 8192;
pub const TIMEOUT: Duration = Duration::from_secs(10);
pub const MAX_CONNS: usize = 16;

/// What the server serves.
pub trait Pages: Send + Sync + 'static {
    /// The `/metrics` body.
    fn metrics(&self) -> String;
    /// The `/` body.
    fn index(&self) -> String;
}

/// The content type of the Prometheus text format 0.0.4.
const METRICS_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Accepts connections until the runtime is dropped (the end of the run).
pub async fn serve(listener: TcpListener, pages: Arc<dyn Pages>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNS));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors or similar: wait a little rather than spin.
                tracing::debug!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            continue;
        };
        let pages = Arc::clone(&pages);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(TIMEOUT, exchange(stream, pages.as_ref())).await;
            drop(permit);
        });
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
        _ => (404, "text/plain", "not found: try /metrics\n".into()),
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    }
}

/// The bytes of a response.
pub fn response(code: u16, ctype: &str, body: &str, head_only: bool) -> Vec<u8> {
    let allow = if code == 405 {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let mut r = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        reason(code),
        body.len()
    )
    .into_bytes();
    if !head_only {
        r.extend_from_slice(body.as_bytes());
    }
    r
}

/// Reads one request head, answers it, closes.
async fn exchange(stream: TcpStream, pages: &dyn Pages) -> io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        stream.readable().await?;
        let n = match stream.try_read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        let answer = match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                let method = req.method.unwrap_or("");
                let (code, ctype, body) = route(method, req.path.unwrap_or("/"), pages);
                response(code, ctype, &body, method == "HEAD")
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_REQUEST => continue,
            Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
                response(431, "text/plain", "request head too large\n", false)
            }
            Err(_) => response(400, "text/plain", "bad request\n", false),
        };
        return write_all(&stream, &answer).await;
    }
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
    }

    fn ask(req: &[u8]) -> String {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            tokio::spawn(serve(l, Arc::new(P)));
            let c = TcpStream::connect(addr).await.unwrap();
            write_all(&c, req).await.unwrap();
            let mut out = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                c.readable().await.unwrap();
                match c.try_read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => out.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(_) => break,
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        })
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
}
