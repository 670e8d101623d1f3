//! Who may call: the API key (compared in constant time; the `Bearer` scheme in any case),
//! and, without a key, only requests that name this server in `Host` (DNS rebinding) and come
//! from no other site's page (`Origin`): a page the user visits cannot drive a server on
//! their loopback. A valid key authorizes a request whatever its `Host` and `Origin`.

use std::net::{IpAddr, SocketAddr};

use hyper::header::{HeaderMap, AUTHORIZATION, CONTENT_TYPE, HOST, ORIGIN};
use subtle::ConstantTimeEq;

use crate::openai::ApiError;
use crate::Config;

/// What the request's credentials say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key {
    /// The server has no key.
    NotRequired,
    Valid,
    Missing,
    Wrong,
}

/// The request's API key against the configured one.
pub(crate) fn key(headers: &HeaderMap, config: &Config) -> Key {
    let Some(expected) = &config.api_key else { return Key::NotRequired };
    let Some(given) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) else { return Key::Missing };
    // RFC 9110 section 11.1: the scheme is case-insensitive.
    match given.trim().split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
            if bool::from(token.trim().as_bytes().ct_eq(expected.as_bytes())) { Key::Valid } else { Key::Wrong }
        }
        _ => Key::Missing,
    }
}

/// Refuses (403) a request whose `Host` names neither the bound address, `localhost`, nor an
/// allowed name (any port), or whose `Origin` is another site's page not allowed by
/// `--allow-origin`.
pub(crate) fn check_site(headers: &HeaderMap, config: &Config, bound: SocketAddr) -> Result<(), ApiError> {
    let host = headers.get(HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !host_allowed(host, config, bound) {
        return Err(ApiError::new(403, format!("Host '{host}' is not this server's name; add it with --allow-host, or send the API key")).code("forbidden_host"));
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let same_site = origin.strip_prefix("http://").is_some_and(|o| o.eq_ignore_ascii_case(host));
        if !same_site && !config.allow_origins.iter().any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(origin)) {
            return Err(ApiError::new(403, format!("requests from pages of {origin} are refused; allow them with --allow-origin {origin}, or send the API key")).code("forbidden_origin"));
        }
    }
    Ok(())
}

/// `host` (`name[:port]`, IPv6 literals bracketed) is the bound address (any address when
/// bound to every interface), `localhost`, or an allowed name.
fn host_allowed(host: &str, config: &Config, bound: SocketAddr) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(n, port)| if port.bytes().all(|b| b.is_ascii_digit()) { n } else { host }),
    };
    if name.eq_ignore_ascii_case("localhost") || config.allow_hosts.iter().any(|a| a.eq_ignore_ascii_case(name)) {
        return true;
    }
    match name.parse::<IpAddr>() {
        // A literal address: the bound one, or any when bound to every interface (the
        // client reached one of ours; a rebinding attack needs a name).
        Ok(ip) => bound.ip().is_unspecified() || ip == bound.ip(),
        Err(_) => false,
    }
}

/// A request body is JSON only when it says so: `application/json`, any parameters.
pub(crate) fn check_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let kind = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let media = kind.split(';').next().unwrap_or("").trim();
    if media.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    let said = if kind.is_empty() { "no Content-Type".to_string() } else { format!("Content-Type '{kind}'") };
    Err(ApiError::new(415, format!("the body must be JSON sent as Content-Type: application/json ({said} was given)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (hyper::header::HeaderName::from_static(k), v.parse().unwrap())).collect()
    }

    #[test]
    fn the_key_is_a_bearer_token_in_any_case_of_the_scheme() {
        let config = Config { api_key: Some("k3y".into()), ..Config::default() };
        assert_eq!(key(&headers(&[("authorization", "Bearer k3y")]), &config), Key::Valid);
        assert_eq!(key(&headers(&[("authorization", "bearer k3y")]), &config), Key::Valid);
        assert_eq!(key(&headers(&[("authorization", "BEARER  k3y ")]), &config), Key::Valid);
        assert_eq!(key(&headers(&[("authorization", "Bearer k3")]), &config), Key::Wrong);
        assert_eq!(key(&headers(&[("authorization", "Basic k3y")]), &config), Key::Missing);
        assert_eq!(key(&headers(&[]), &config), Key::Missing);
        assert_eq!(key(&headers(&[]), &Config::default()), Key::NotRequired);
    }

    #[test]
    fn hosts_and_origins_must_be_this_servers_unless_allowed() {
        let bound: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let config = Config { allow_hosts: vec!["llada.lan".into()], allow_origins: vec!["https://app.example".into()], ..Config::default() };
        for ok in ["localhost:8080", "127.0.0.1:9", "LOCALHOST", "llada.lan:80"] {
            assert!(check_site(&headers(&[("host", ok)]), &config, bound).is_ok(), "{ok}");
        }
        for bad in ["evil.example", "evil.example:8080", "10.0.0.1:8080", "", "[::1]:8080"] {
            assert_eq!(check_site(&headers(&[("host", bad)]), &config, bound).unwrap_err().status, 403, "{bad}");
        }
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert!(check_site(&headers(&[("host", "10.0.0.1:8080")]), &config, any).is_ok(), "bound to every interface: any literal address");
        let with_origin = |o| headers(&[("host", "127.0.0.1:8080"), ("origin", o)]);
        assert!(check_site(&with_origin("http://127.0.0.1:8080"), &config, bound).is_ok(), "the live view's own page");
        assert!(check_site(&with_origin("https://app.example"), &config, bound).is_ok());
        assert_eq!(check_site(&with_origin("http://evil.example"), &config, bound).unwrap_err().status, 403);
        assert_eq!(check_site(&with_origin("null"), &config, bound).unwrap_err().status, 403);
    }

    #[test]
    fn only_a_json_content_type_is_json() {
        assert!(check_json(&headers(&[("content-type", "application/json")])).is_ok());
        assert!(check_json(&headers(&[("content-type", "Application/JSON; charset=utf-8")])).is_ok());
        for bad in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
            assert_eq!(check_json(&headers(&[("content-type", bad)])).unwrap_err().status, 415, "{bad}");
        }
        assert_eq!(check_json(&headers(&[])).unwrap_err().status, 415);
    }
}
