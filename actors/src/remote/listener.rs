//! The trainer's door: accepts connections, runs each handshake under a deadline,
//! admits authenticated nodes into free slots and rejects everyone else with a reason.
//! Before login a connection costs at most a [`LOGIN_MAX_FRAME`] read, at most
//! [`MAX_PENDING_LOGINS`] wait at once, accept errors back off, and its log lines
//! are rate-limited: anyone can reach the port.
//! The decisions are the core's ([`TrainerHandshake`], [`Admission`]); this moves
//! their frames. Admitted nodes wait for the run to start in the `lobby`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use std::time::{Duration, Instant};

use rollout::connection::{Admission, HandshakeStep, LogLimit, PendingLogins, TrainerHandshake};
use rollout::node_spec::NodeSpec;
use rollout::wire::{self, AdmitVersions, TrainerFrame, Welcome, LOGIN_MAX_FRAME, NONCE_LEN};
use rollout::Weights;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_rustls::{TlsAcceptor, TlsStream};

use super::stream::{tls_socket, PeerStream};
use super::timing::{read_frame, PeerTiming};
use crate::metrics::{RefusalReason, RunMetrics};

/// What the listener needs to admit nodes.
#[derive(Clone)]
pub(crate) struct DoorConfig {
    /// The shared token.
    pub(crate) token: Vec<u8>,
    /// Heartbeat and frame limits, told to every node in `Welcome`.
    pub(crate) timing: PeerTiming,
    /// Deadline of one handshake.
    pub(crate) handshake_timeout: Duration,
    /// The protocol versions that can serve the run; any other is refused at `hello`.
    pub(crate) versions: AdmitVersions,
    /// Where refusals are counted, when metrics are on.
    pub(crate) metrics: Option<RunMetrics>,
    /// TLS: every connection's first bytes are a TLS handshake, run under the login's
    /// deadline; `None`: plain TCP.
    pub(crate) tls: Option<TlsAcceptor>,
}

/// A node that passed the handshake and was sent `Welcome`.
pub(crate) struct Joined {
    /// Its slot.
    pub(crate) index: usize,
    /// Its name.
    pub(crate) name: String,
    /// The connection.
    pub(crate) stream: PeerStream,
}

async fn send(s: &mut PeerStream, f: &TrainerFrame, max: usize) -> Result<(), String> {
    let bytes = wire::encode(f, max).map_err(|e| e.to_string())?;
    s.write_all(&bytes).await.map_err(|e| format!("writing a frame: {e}"))?;
    // Under TLS, the frame's last records may still be in the session: out they go.
    s.flush().await.map_err(|e| format!("writing a frame: {e}"))
}

/// Each node's weights to welcome it with, by index: the trainer's version 0 (a node
/// that rejoins gets newer weights from the trainer right after, as an update).
pub(crate) type WelcomeWeights = Rc<Vec<Option<Arc<Weights>>>>;

/// Most connections waiting to log in at once; one more closes the oldest. Real
/// nodes log in within a round trip or two, so only a flood or idle peers reach it.
pub(crate) const MAX_PENDING_LOGINS: usize = 64;

/// At the cap, how long the accept loop leaves the oldest connection to log in
/// before the next arrival closes it: the door stops accepting meanwhile (the
/// kernel's backlog holds the arrivals) and goes on as soon as any login ends. A
/// thousand real nodes joining at once log in 64 at a time instead of closing each
/// other; an idle peer still goes, a quarter second later. (The handshake deadline
/// is far longer.)
pub(crate) const LOGIN_GRACE: Duration = Duration::from_millis(250);

/// [`LOGIN_GRACE`] for a door that speaks TLS: a TLS handshake costs both ends a key
/// exchange and a signature, about a millisecond of the trainer's thread each on a
/// loaded two-core machine, so 64 of them (and the nodes' side of them) do not fit in a
/// quarter second there: a thousand nodes joining at once were closed mid-handshake.
pub(crate) const TLS_LOGIN_GRACE: Duration = Duration::from_secs(1);

impl DoorConfig {
    /// How long the oldest waiting login is left at the cap (see [`LOGIN_GRACE`]).
    fn login_grace(&self) -> Duration {
        if self.tls.is_some() {
            TLS_LOGIN_GRACE
        } else {
            LOGIN_GRACE
        }
    }
}

/// How long the accept loop waits after an accept error before trying again (out
/// of file descriptors, say: retrying at once would spin), as hyper's does.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The accept loop's log lines, each kind at most once a second.
struct DoorLogs {
    accept: LogLimit,
    refused: LogLimit,
    evicted: LogLimit,
}

impl DoorLogs {
    fn new() -> DoorLogs {
        let second = Duration::from_secs(1);
        DoorLogs {
            accept: LogLimit::new(second),
            refused: LogLimit::new(second),
            evicted: LogLimit::new(second),
        }
    }
}

/// Runs the accept loop for the life of the actix system, over slots the caller keeps:
/// every node admitted comes out of the returned channel, welcomed with its weights of
/// `weights`; releasing slot `i` (its node is gone and being replaced) lets a node
/// asking for index `i` in again.
pub(crate) fn open_with(
    listener: TcpListener,
    specs: Vec<NodeSpec>,
    cfg: DoorConfig,
    weights: WelcomeWeights,
    admission: Rc<RefCell<Admission>>,
) -> mpsc::UnboundedReceiver<Joined> {
    let (tx, rx) = mpsc::unbounded_channel();
    let specs = Rc::new(specs);
    let logs = Rc::new(RefCell::new(DoorLogs::new()));
    let pending = Rc::new(RefCell::new(PendingLogins::<(Instant, oneshot::Sender<()>)>::new(
        MAX_PENDING_LOGINS,
    )));
    let freed = Rc::new(Notify::new());
    actix_rt::spawn(async move {
        loop {
            // At the cap, an arrival would close the oldest: first give it its grace.
            loop {
                let left = grace_left(&pending.borrow(), Instant::now(), cfg.login_grace());
                let Some(wait) = left else { break };
                tokio::select! {
                    _ = freed.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    if let Some(held) = logs.borrow_mut().accept.hit(Instant::now()) {
                        tracing::warn!(error = %e, suppressed = held, "accept failed; retrying in {} ms", ACCEPT_BACKOFF.as_millis());
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let (cancel_tx, cancel) = oneshot::channel();
            let (id, evicted) = pending.borrow_mut().arrive((Instant::now(), cancel_tx));
            if evicted.is_some() {
                drop(evicted);
                if let Some(held) = logs.borrow_mut().evicted.hit(Instant::now()) {
                    tracing::warn!(
                        suppressed = held,
                        "{MAX_PENDING_LOGINS} connections waiting to log in: closed the oldest"
                    );
                }
            }
            let (cfg, specs, admission, weights, tx, logs, pending, freed) = (
                cfg.clone(),
                specs.clone(),
                admission.clone(),
                weights.clone(),
                tx.clone(),
                logs.clone(),
                pending.clone(),
                freed.clone(),
            );
            actix_rt::spawn(async move {
                let leave = || {
                    if pending.borrow_mut().leave(id).is_some() {
                        freed.notify_one();
                    }
                };
                let r = door(stream, &cfg, &specs, &admission, &weights, cancel, leave).await;
                leave();
                match r {
                    Ok(joined) => {
                        tracing::info!(node = joined.index, name = %joined.name, %peer, "node joined");
                        let _ = tx.send(joined);
                    }
                    Err((why, reason)) => {
                        if let Some(m) = &cfg.metrics {
                            m.refused(why);
                        }
                        if let Some(held) = logs.borrow_mut().refused.hit(Instant::now()) {
                            tracing::warn!(%peer, %reason, suppressed = held, "connection refused");
                        }
                    }
                }
            });
        }
    });
    rx
}

/// How long the accept loop is to wait before the next arrival may close the oldest
/// waiting login (`None`: accept now, below the cap or the oldest's grace over).
fn grace_left<T>(pending: &PendingLogins<(Instant, T)>, now: Instant, grace: Duration) -> Option<Duration> {
    if !pending.is_full() {
        return None;
    }
    let (since, _) = pending.oldest()?;
    let left = (*since + grace).saturating_duration_since(now);
    (!left.is_zero()).then_some(left)
}

/// One connection through the door: the TLS handshake when the door has a certificate,
/// then login, both under the one handshake deadline counted from the accept (ended
/// early when evicted), then admission and `welcome`. `logged_in` is called once the
/// token is proved, so an admitted node no longer counts as waiting.
#[allow(clippy::too_many_arguments)]
async fn door(
    s: TcpStream,
    cfg: &DoorConfig,
    specs: &[NodeSpec],
    admission: &RefCell<Admission>,
    weights: &[Option<Arc<Weights>>],
    cancel: oneshot::Receiver<()>,
    logged_in: impl FnOnce(),
) -> Result<Joined, (RefusalReason, String)> {
    let _ = s.set_nodelay(true);
    let deadline = cfg.handshake_timeout;
    let until = tokio::time::Instant::now() + deadline;
    let max = cfg.timing.max_frame;
    let timed_out = || {
        (
            RefusalReason::Timeout,
            format!("handshake not done within {:.1} s", deadline.as_secs_f64()),
        )
    };
    let evicted = || {
        (
            RefusalReason::Evicted,
            format!(
                "closed to make room: {MAX_PENDING_LOGINS} connections were waiting to log in and this was the oldest"
            ),
        )
    };
    let mut cancel = cancel;
    let mut s = match &cfg.tls {
        None => PeerStream::Plain(s),
        // A TLS handshake that fails or stalls is closed unanswered: there is no
        // encrypted link to say `reject` on.
        Some(acceptor) => tokio::select! {
            r = tokio::time::timeout_at(until, acceptor.accept(tls_socket(s))) => match r {
                Ok(Ok(t)) => PeerStream::Tls(Box::new(TlsStream::Server(t))),
                Ok(Err(e)) => return Err((RefusalReason::Tls, format!("TLS handshake failed: {e}"))),
                Err(_) => return Err(timed_out()),
            },
            _ = &mut cancel => return Err(evicted()),
        },
    };
    let outcome = tokio::select! {
        r = tokio::time::timeout_at(until, login(&mut s, cfg)) => match r {
            Ok(r) => r.map_err(|e| (RefusalReason::Login, e)),
            Err(_) => Err(timed_out()),
        },
        _ = &mut cancel => Err(evicted()),
    };
    let (node_name, node_index) = match outcome {
        // The name is only ever shown from now on (the proof covered it as sent):
        // bounded and escaped once, here, for every log line and error that names it.
        Ok((name, index)) => (rollout::peer_text::bounded(&name), index),
        Err((why, reason)) => {
            // Best effort and bounded: a peer that does not read gets nothing.
            let reject = TrainerFrame::Reject { reason: reason.clone() };
            let _ = tokio::time::timeout(Duration::from_millis(100), send(&mut s, &reject, max)).await;
            return Err((why, reason));
        }
    };
    logged_in();
    let admitted = admission.borrow_mut().admit(node_index);
    let index = match admitted {
        Ok(i) => i,
        Err(reason) => {
            let reject = TrainerFrame::Reject { reason: reason.clone() };
            let _ = tokio::time::timeout(deadline, send(&mut s, &reject, max)).await;
            return Err((RefusalReason::Admission, format!("{node_name}: {reason}")));
        }
    };
    let welcome = Welcome {
        node_index: index,
        spec: specs[index].clone(),
        weights: weights.get(index).cloned().flatten().map(Arc::unwrap_or_clone),
        heartbeat_ms: cfg.timing.heartbeat.as_millis() as u64,
        heartbeat_timeout_ms: cfg.timing.timeout.as_millis() as u64,
        max_frame: max as u64,
    };
    let sent = tokio::time::timeout(deadline, send(&mut s, &TrainerFrame::Welcome(Box::new(welcome)), max)).await;
    let sent = sent.unwrap_or_else(|_| Err(format!("welcome not taken within {:.1} s", deadline.as_secs_f64())));
    if let Err(e) = sent {
        admission.borrow_mut().release(index);
        return Err((RefusalReason::Welcome, e));
    }
    Ok(Joined {
        index,
        name: node_name,
        stream: s,
    })
}

/// The frames before admission, each at most [`LOGIN_MAX_FRAME`] bytes (refused from
/// its prefix), decoded strictly by the core: who the node is, once it proved the token
/// (speaking a protocol version that can serve the run).
async fn login(s: &mut PeerStream, cfg: &DoorConfig) -> Result<(String, Option<usize>), String> {
    let nonce: Vec<u8> = (0..NONCE_LEN).map(|_| rand::random::<u8>()).collect();
    let mut hs = TrainerHandshake::new(&cfg.token, nonce).admitting(cfg.versions.clone());
    loop {
        let body = read_frame(s, LOGIN_MAX_FRAME)
            .await
            .map_err(|e| format!("before login: {e}"))?;
        match hs.on_frame(&body) {
            HandshakeStep::Send(f) => send(s, &f, LOGIN_MAX_FRAME).await?,
            HandshakeStep::Reject(reason) => return Err(reason),
            HandshakeStep::Authenticated { node_name, node_index } => return Ok((node_name, node_index)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_door_waits_out_the_oldest_logins_grace_and_below_it_not_at_all() {
        let t0 = Instant::now();
        let mut pending = PendingLogins::new(2);
        assert_eq!(grace_left(&pending, t0, LOGIN_GRACE), None, "empty: accept");
        pending.arrive((t0, ()));
        assert_eq!(grace_left(&pending, t0, LOGIN_GRACE), None, "below the cap: accept");
        pending.arrive((t0 + Duration::from_millis(100), ()));
        let ms = Duration::from_millis;
        assert_eq!(
            grace_left(&pending, t0 + ms(50), LOGIN_GRACE),
            Some(LOGIN_GRACE - ms(50)),
            "the oldest's grace"
        );
        assert_eq!(
            grace_left(&pending, t0 + LOGIN_GRACE, LOGIN_GRACE),
            None,
            "grace over: the next arrival closes it"
        );
        let (_, evicted) = pending.arrive((t0 + LOGIN_GRACE, ()));
        assert!(evicted.is_some());
        assert_eq!(
            grace_left(&pending, t0 + LOGIN_GRACE, LOGIN_GRACE),
            Some(ms(100)),
            "then the next oldest's grace counts"
        );
    }
}
