//! Credentials removed from any text before it is printed or logged.

use bson::Bson;
use mongodb::options::ConnectionString;

/// Usernames shorter than this are left in text (a username is not a secret; redacting a letter
/// everywhere would only garble the message). Passwords and tokens are removed whatever their
/// length.
const MIN_REDACTED_USERNAME: usize = 3;

/// Removes a URI's credentials from any text before it is printed or logged.
///
/// The secrets come from the driver's own parse of the URI ([`ConnectionString`]): the username,
/// the password and every value of `authMechanismProperties` (e.g. `AWS_SESSION_TOKEN`). Each is
/// removed as parsed, fully percent-encoded (either hex case) and in every spelling the raw URI
/// uses for it (any mix of percent-encoded and literal characters). This build's driver refuses
/// `tlsCertificateKeyFilePassword` and `proxyPassword` (their features are off) and the AWS and
/// GSSAPI mechanisms, so a URI carrying them never parses and is never echoed at all.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// The redactor of a parsed connection string; `raw` is the URI as given.
    pub fn for_connection_string(parsed: &ConnectionString, raw: &str) -> Redactor {
        let mut plain: Vec<String> = Vec::new();
        if let Some(credential) = &parsed.credential {
            if let Some(user) = &credential.username
                && user.chars().count() >= MIN_REDACTED_USERNAME
            {
                plain.push(user.clone());
            }
            plain.extend(credential.password.iter().cloned());
            if let Some(properties) = &credential.mechanism_properties {
                for (_, value) in properties {
                    match value {
                        Bson::String(text) => plain.push(text.clone()),
                        other => plain.push(other.to_string()),
                    }
                }
            }
        }
        let mut secrets = Vec::new();
        for secret in plain.into_iter().filter(|s| !s.is_empty()) {
            secrets.extend(spellings_in(raw, &secret));
            // As a driver or server message would escape it, in either hex case.
            let escaped =
                percent_encoding::utf8_percent_encode(&secret, percent_encoding::NON_ALPHANUMERIC)
                    .to_string();
            if escaped != secret {
                secrets.push(lower_hex_escapes(&escaped));
                secrets.push(escaped);
            }
            secrets.push(secret);
        }
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Redactor { secrets }
    }

    /// Parses `uri` with the driver and builds its redactor; `None` when it does not parse.
    pub fn for_uri(uri: &str) -> Option<Redactor> {
        let parsed = ConnectionString::parse(crate::uri::prepare(uri).uri).ok()?;
        Some(Redactor::for_connection_string(&parsed, uri))
    }

    pub fn clean(&self, text: &str) -> String {
        let mut text = text.to_string();
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "***");
        }
        text
    }
}

/// `%3A` written `%3a`: the hex digits of every escape in lower case.
fn lower_hex_escapes(escaped: &str) -> String {
    let mut out = String::with_capacity(escaped.len());
    let mut after_percent = 0;
    for c in escaped.chars() {
        if after_percent > 0 {
            out.push(c.to_ascii_lowercase());
            after_percent -= 1;
        } else {
            out.push(c);
            if c == '%' {
                after_percent = 2;
            }
        }
    }
    out
}

/// Every substring of `raw` that percent-decodes to `secret` (each `%XX` taken as one byte), as
/// it is spelled in `raw`, when that spelling differs from `secret` itself.
fn spellings_in(raw: &str, secret: &str) -> Vec<String> {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let (raw_bytes, wanted) = (raw.as_bytes(), secret.as_bytes());
    let mut found = Vec::new();
    for start in 0..raw_bytes.len() {
        let (mut at, mut matched) = (start, 0);
        while matched < wanted.len() && at < raw_bytes.len() {
            let (byte, width) = match raw_bytes[at] {
                b'%' => {
                    match (
                        raw_bytes.get(at + 1).copied().and_then(hex),
                        raw_bytes.get(at + 2).copied().and_then(hex),
                    ) {
                        (Some(high), Some(low)) => (high << 4 | low, 3),
                        _ => (b'%', 1),
                    }
                }
                other => (other, 1),
            };
            if byte != wanted[matched] {
                break;
            }
            matched += 1;
            at += width;
        }
        if matched == wanted.len()
            && let Some(spelling) = raw.get(start..at)
            && spelling != secret
        {
            found.push(spelling.to_string());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Connection, UNPARSABLE_URI};
    use handoff_domain::error::HandoffError;

    /// Redacts `text` with the redactor of `uri`, which must parse.
    fn cleaned(uri: &str, text: &str) -> String {
        Redactor::for_uri(uri)
            .unwrap_or_else(|| panic!("{uri} parses"))
            .clean(text)
    }

    #[test]
    fn password_and_username_never_survive_redaction() {
        let uri = "mongodb://app_user:s3cr%40t@db.example:27017/?replicaSet=rs0";
        let clean = cleaned(
            uri,
            "auth failed for app_user:s3cr%40t and s3cr@t at db.example",
        );
        assert!(!clean.contains("s3cr"), "{clean}");
        assert!(!clean.contains("app_user"), "{clean}");
        assert!(clean.contains("db.example"), "{clean}");
        assert_eq!(cleaned("mongodb://localhost/", "x"), "x");
    }

    #[test]
    fn a_password_with_uri_delimiters_is_redacted_in_every_spelling() {
        // The password is `p?a@s/s:w0rd#1`, percent-encoded as the URI rules require.
        let uri = "mongodb://alice:p%3Fa%40s%2Fs%3Aw0rd%231@db.example/admin?replicaSet=rs0";
        let parsed = ConnectionString::parse(uri).unwrap();
        let password = parsed
            .credential
            .as_ref()
            .unwrap()
            .password
            .clone()
            .unwrap();
        assert_eq!(password, "p?a@s/s:w0rd#1");
        let text = format!(
            "decoded {password} raw p%3Fa%40s%2Fs%3Aw0rd%231 lower p%3fa%40s%2fs%3aw0rd%231"
        );
        let clean = Redactor::for_connection_string(&parsed, uri).clean(&text);
        assert!(!clean.contains("w0rd"), "{clean}");
        assert_eq!(clean, "decoded *** raw *** lower ***");
    }

    #[test]
    fn a_password_spelled_with_needless_escapes_is_redacted_as_spelled() {
        // `%65` is a plain `e`: the raw URI spells the password differently from its value.
        let uri = "mongodb://alice:s%65cretPw@db.example/";
        let clean = cleaned(uri, "uri had s%65cretPw, value secretPw");
        assert_eq!(clean, "uri had ***, value ***");
    }

    #[test]
    fn every_auth_mechanism_property_is_redacted() {
        let uri = "mongodb://alice@db.example/?authMechanism=MONGODB-OIDC\
                   &authMechanismProperties=ENVIRONMENT:azure,TOKEN_RESOURCE:api%3A%2F%2FRes0urceSecret";
        let clean = cleaned(
            uri,
            "resource api://Res0urceSecret or api%3A%2F%2FRes0urceSecret in azure",
        );
        assert!(!clean.contains("Res0urceSecret"), "{clean}");
        assert!(!clean.contains("azure"), "{clean}");
    }

    #[test]
    fn uris_the_driver_refuses_get_no_redactor_and_a_fixed_message() {
        for uri in [
            // Session tokens and TLS key passwords: this build's driver refuses them at parse.
            "mongodb://AKIAEXAMPLE:s3cr3tKey@db.example/?authMechanism=MONGODB-AWS\
             &authMechanismProperties=AWS_SESSION_TOKEN:T0k3nValue",
            "mongodb://db.example/?tls=true&tlsCertificateKeyFile=/k.pem&tlsCertificateKeyFilePassword=K3yPass",
            "mongodb://alice:s3cr3t@/db",
            "mongodb://alice:p@s3cr3t@db.example/",
            "mongodb://alice:s3cr3t%@db.example/",
            "mongodb://alice:s3cr3t@db.example/?bogusOption=1",
        ] {
            assert!(Redactor::for_uri(uri).is_none(), "{uri} parsed");
            match Connection::connect(uri) {
                Err(HandoffError::BadInput(message)) => {
                    assert!(message.starts_with(UNPARSABLE_URI), "{message}");
                    for secret in ["s3cr3t", "T0k3nValue", "K3yPass", "AKIAEXAMPLE", "alice"] {
                        assert!(!message.contains(secret), "{uri}: {message}");
                    }
                }
                Err(other) => panic!("{uri}: {other}"),
                Ok(_) => panic!("{uri}: connected"),
            }
        }
    }

    #[test]
    fn short_usernames_stay_but_short_passwords_go() {
        let clean = cleaned("mongodb://al:pw@db.example/", "al logged in with pw");
        assert_eq!(clean, "al logged in with ***");
    }
}
