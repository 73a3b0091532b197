//! A bare HTTP/1 client for tests: one request per connection, written as given (so a
//! test can send what no client library would), read until the server closes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// What a server answered: its status and body (`None` status: it closed without an
/// answer).
#[derive(Debug)]
pub struct HttpAnswer {
    /// The status code of the answer's first line.
    pub status: Option<u16>,
    /// Everything after the head.
    pub body: String,
}

/// Sends `raw` to `addr` and reads until the server closes (at most `within`).
pub fn http_raw(addr: SocketAddr, raw: &[u8], within: Duration) -> std::io::Result<HttpAnswer> {
    let mut s = TcpStream::connect_timeout(&addr, within)?;
    s.set_read_timeout(Some(within))?;
    s.set_write_timeout(Some(within))?;
    // A server that answers before reading all of it may close on the rest: its answer counts.
    let _ = s.write_all(raw);
    let mut bytes = Vec::new();
    match s.read_to_end(&mut bytes) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !bytes.is_empty() => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            return Ok(HttpAnswer {
                status: None,
                body: String::new(),
            })
        }
        Err(e) => return Err(e),
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let status = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok());
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok(HttpAnswer { status, body })
}

/// `GET path` (no keep-alive), answered within 10 s.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<HttpAnswer> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    http_raw(addr, req.as_bytes(), Duration::from_secs(10))
}

/// `s` percent-encoded for a URL's query.
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
