//! [`MetadataServer`]: a server of Mooncake's HTTP metadata protocol, so that a cluster
//! that names one (`http://host:port/metadata`) needs no Mooncake install.

use crate::error::{Error, Result};
use crate::metadata::lock;
use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tiny_http::{Method, Request, Response};

/// The largest value stored (a larger PUT is answered 413).
pub const MAX_VALUE: usize = 64 << 20;

/// The most keys stored (a PUT of one more is answered 507).
pub const MAX_KEYS: usize = 1 << 20;

/// A server of Mooncake's HTTP metadata protocol (see [`HttpMetadata`](crate::HttpMetadata))
/// at `http://<addr>/metadata`, in memory, answering as Mooncake's own server does:
/// `GET` 200 with the value or 404, `PUT` 200 (400 for a second value of a key holding
/// `rpc_meta`, which Mooncake's engines keep unique), `DELETE` 200 or 404, 400 without a
/// key, 405 for other methods. Values are at most [`MAX_VALUE`] bytes (413), keys at most
/// [`MAX_KEYS`] (507). It runs until dropped.
pub struct MetadataServer {
    http: Arc<tiny_http::Server>,
    addr: SocketAddr,
    store: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetadataServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl MetadataServer {
    /// Listens on `bind` (port 0: any free port) and serves until dropped.
    ///
    /// # Errors
    /// [`Error::Io`] when the address cannot be bound or the thread cannot start.
    pub fn start(bind: SocketAddr) -> Result<MetadataServer> {
        let http = tiny_http::Server::http(bind).map_err(|e| Error::Io {
            op: "bind the HTTP metadata server to",
            addr: bind.to_string(),
            detail: e.to_string(),
        })?;
        let addr = http.server_addr().to_ip().unwrap_or(bind);
        let http = Arc::new(http);
        let store = Arc::new(Mutex::new(HashMap::new()));
        let (h, s) = (http.clone(), store.clone());
        let thread = std::thread::Builder::new()
            .name("http-metadata".into())
            .spawn(move || {
                for req in h.incoming_requests() {
                    serve(&s, req);
                }
            })
            .map_err(|e| Error::io("start the HTTP metadata server's thread on", addr, e))?;
        Ok(MetadataServer {
            http,
            addr,
            store,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its URL, `http://<addr>/metadata`: what agents and Mooncake's engines are given.
    pub fn url(&self) -> String {
        format!("http://{}/metadata", self.addr)
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        lock(&self.store).len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for MetadataServer {
    /// Stops serving: the listener closes and the thread ends.
    fn drop(&mut self) {
        self.http.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The `key` of a request's query string, trimmed (as Mooncake's server reads it).
fn key_of(url: &str) -> Option<String> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "key")
        .map(|(_, v)| v.trim().to_string())
}

fn answer(req: Request, status: u16, body: impl Into<Vec<u8>>) {
    let r = Response::from_data(body.into()).with_status_code(status);
    // A client that went away has no one to tell.
    let _ = req.respond(r);
}

fn serve(store: &Mutex<HashMap<String, Vec<u8>>>, mut req: Request) {
    if req.url().split('?').next() != Some("/metadata") {
        return answer(req, 404, "not found");
    }
    let key = match key_of(req.url()) {
        Some(k) if !k.is_empty() => k,
        _ => return answer(req, 400, "metadata key is required"),
    };
    match req.method() {
        Method::Get => match lock(store).get(&key).cloned() {
            Some(v) => answer(req, 200, v),
            None => answer(req, 404, "metadata not found"),
        },
        Method::Put => {
            if req.body_length().is_some_and(|n| n > MAX_VALUE) {
                return answer(req, 413, "metadata value too large");
            }
            let mut value = Vec::new();
            let read = req
                .as_reader()
                .take(MAX_VALUE as u64 + 1)
                .read_to_end(&mut value);
            if read.is_err() {
                return answer(req, 400, "metadata value could not be read");
            }
            if value.len() > MAX_VALUE {
                return answer(req, 413, "metadata value too large");
            }
            let mut s = lock(store);
            if key.contains("rpc_meta") && s.contains_key(&key) {
                drop(s);
                return answer(req, 400, "Duplicate rpc_meta key not allowed");
            }
            if !s.contains_key(&key) && s.len() >= MAX_KEYS {
                drop(s);
                return answer(req, 507, "metadata server full");
            }
            s.insert(key, value);
            drop(s);
            answer(req, 200, "metadata updated")
        }
        Method::Delete => match lock(store).remove(&key) {
            Some(_) => answer(req, 200, "metadata deleted"),
            None => answer(req, 404, "metadata not found"),
        },
        _ => answer(req, 405, "Method not allowed"),
    }
}
