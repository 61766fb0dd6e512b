//! HTTP as a prober sees it: the metrics endpoint's `/metrics`, `/healthz` and `/readyz`.

use std::time::Duration;

/// A reply: its status code, its content type and its body.
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// `GET path` from `127.0.0.1:port` within 5 s, whatever the status; `None` when nothing
/// answered.
pub fn get(port: u16, path: &str) -> Option<Reply> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .get(&format!("http://127.0.0.1:{port}{path}"))
        .call()
        .ok()?;
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    Some(Reply {
        status: response.status().as_u16(),
        content_type,
        body: response.body_mut().read_to_string().ok()?,
    })
}

/// The status of `GET path`, `None` when nothing answered.
pub fn status(port: u16, path: &str) -> Option<u16> {
    get(port, path).map(|reply| reply.status)
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
