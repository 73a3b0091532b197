//! The `/metrics` endpoint: an HTTP/1 server (hyper) on a thread and runtime of its
//! own. It answers `GET /metrics` only (another path 404, another method 405), reads a
//! request head of at most [`MAX_HEAD`] bytes (431 past it), serves one request per
//! connection, cuts a connection still open after [`CONNECTION_DEADLINE`] (a slow or
//! silent client), and holds at most [`MAX_CONNECTIONS`] at once (more are closed on
//! arrival).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::{oneshot, Semaphore};

use super::registry::RunMetrics;

/// Longest request head read (hyper's smallest buffer): longer ones are answered 431.
pub const MAX_HEAD: usize = 8 << 10;

/// A connection still open this long after it was accepted is cut.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(5);

/// Connections served at once; one more is closed as it arrives.
pub const MAX_CONNECTIONS: usize = 16;

/// The only path served.
pub const PATH: &str = "/metrics";

/// What the OpenMetrics text is served as.
const CONTENT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address is not `HOST:PORT`, or cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The server's thread or runtime could not start.
    #[error("cannot start the metrics server: {0}")]
    Start(std::io::Error),
}

/// Scrapes served so far, which a caller can wait on.
#[derive(Debug, Default)]
struct Scrapes {
    count: Mutex<u64>,
    changed: Condvar,
}

impl Scrapes {
    fn served(&self) {
        let mut c = self.count.lock().unwrap_or_else(|e| e.into_inner());
        *c += 1;
        self.changed.notify_all();
    }

    fn get(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until more than `seen` scrapes were served, at most until `deadline`.
    fn wait_past(&self, seen: u64, deadline: Instant) -> bool {
        let mut c = self.count.lock().unwrap_or_else(|e| e.into_inner());
        while *c <= seen {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            c = match self.changed.wait_timeout(c, left) {
                Ok((c, _)) => c,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }
}

/// A running `/metrics` endpoint; dropping it stops the server and joins its thread.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    metrics: RunMetrics,
    scrapes: Arc<Scrapes>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves `metrics` on `addr` (`HOST:PORT`; port 0 picks one, see [`Self::local_addr`]).
    pub fn start(addr: &str, metrics: RunMetrics) -> Result<MetricsServer, ServeError> {
        let bind = |source| ServeError::Bind {
            addr: addr.to_string(),
            source,
        };
        let listener = std::net::TcpListener::bind(addr).map_err(bind)?;
        listener.set_nonblocking(true).map_err(bind)?;
        let local = listener.local_addr().map_err(bind)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(ServeError::Start)?;
        let (stop, stopped) = oneshot::channel();
        let scrapes = Arc::new(Scrapes::default());
        let served = (metrics.clone(), Arc::clone(&scrapes));
        let thread = std::thread::Builder::new()
            .name("rollout-metrics".into())
            .spawn(move || {
                rt.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => accept(l, served, stopped).await,
                        Err(e) => tracing::error!(error = %e, "metrics server cannot listen"),
                    }
                })
            })
            .map_err(ServeError::Start)?;
        tracing::info!(addr = %local, "serving metrics on http://{local}{PATH}");
        Ok(MetricsServer {
            addr: local,
            metrics,
            scrapes,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The metrics served.
    pub fn metrics(&self) -> &RunMetrics {
        &self.metrics
    }

    /// Scrapes answered so far.
    pub fn scrapes(&self) -> u64 {
        self.scrapes.get()
    }

    /// Waits until one scrape is answered (written whole) after this call, at most `limit`:
    /// a scraper then has the values as they are now. `false`: none came in time.
    pub fn wait_for_scrape(&self, limit: Duration) -> bool {
        let seen = self.scrapes.get();
        self.scrapes.wait_past(seen, Instant::now() + limit)
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Accepts connections until `stopped`, each served on a task of its own.
async fn accept(
    listener: tokio::net::TcpListener,
    served: (RunMetrics, Arc<Scrapes>),
    mut stopped: oneshot::Receiver<()>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of descriptors, say: the next accept may succeed once some close.
                    tracing::warn!(error = %e, "metrics server cannot accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let (metrics, scrapes) = served.clone();
        tokio::spawn(async move {
            let answered = Arc::new(AtomicBool::new(false));
            let ok = Arc::clone(&answered);
            let service = service_fn(move |req| {
                let r = answer(&req, &metrics);
                if r.status() == StatusCode::OK {
                    ok.store(true, Ordering::Relaxed);
                }
                async move { Ok::<_, Infallible>(r) }
            });
            let conn = http1::Builder::new()
                .max_buf_size(MAX_HEAD)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            // A scrape counts once its answer was written whole.
            if let Ok(Ok(())) = tokio::time::timeout(CONNECTION_DEADLINE, conn).await {
                if answered.load(Ordering::Relaxed) {
                    scrapes.served();
                }
            }
            drop(slot);
        });
    }
}

/// The answer to one request: the metrics for `GET /metrics`, else 404 or 405.
fn answer(req: &Request<Incoming>, metrics: &RunMetrics) -> Response<Full<Bytes>> {
    let status = if req.uri().path() != PATH {
        StatusCode::NOT_FOUND
    } else if req.method() != Method::GET {
        StatusCode::METHOD_NOT_ALLOWED
    } else {
        let mut r = Response::new(Full::new(Bytes::from(metrics.encode())));
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT));
        return r;
    };
    let mut r = Response::new(Full::new(Bytes::from(status.canonical_reason().unwrap_or_default())));
    *r.status_mut() = status;
    if status == StatusCode::METHOD_NOT_ALLOWED {
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET"));
    }
    r
}
