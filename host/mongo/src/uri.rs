//! The connection string as the Python task takes it: options PyMongo reads that have no effect
//! here are set aside with one warning naming them, and a refused URI names the option the driver
//! refuses (never a value: values may be secrets).

use mongodb::options::ConnectionString;

/// The message for a URI the driver cannot parse: it echoes nothing of the URI.
pub const UNPARSABLE_URI: &str = "MONGODB_URI is not a valid MongoDB connection string";

/// Options PyMongo takes that change nothing here: how Python decodes values (`uuidRepresentation`,
/// `tz_aware`, `datetime_conversion`, `unicode_decode_error_handler`), when it connects
/// (`connect`), wire compression, and timeouts and write concerns handoff sets itself (every
/// handoff call has its own deadline; its writes are always majority-acknowledged).
const NO_EFFECT: &[&str] = &[
    "uuidRepresentation",
    "tz_aware",
    "datetime_conversion",
    "unicode_decode_error_handler",
    "connect",
    "compressors",
    "zlibCompressionLevel",
    "fsync",
    "socketTimeoutMS",
    "timeoutMS",
    "waitQueueMultiple",
    "tlsDisableOCSPEndpointCheck",
];

/// The options of MongoDB's connection string specification (and PyMongo's own): the names a
/// refusal may print.
const KNOWN: &[&str] = &[
    "appName",
    "authMechanism",
    "authMechanismProperties",
    "authSource",
    "connectTimeoutMS",
    "directConnection",
    "heartbeatFrequencyMS",
    "journal",
    "loadBalanced",
    "localThresholdMS",
    "maxConnecting",
    "maxIdleTimeMS",
    "maxPoolSize",
    "maxStalenessSeconds",
    "minPoolSize",
    "proxyHost",
    "proxyPort",
    "proxyUsername",
    "proxyPassword",
    "readConcernLevel",
    "readPreference",
    "readPreferenceTags",
    "replicaSet",
    "retryReads",
    "retryWrites",
    "serverMonitoringMode",
    "serverSelectionTimeoutMS",
    "serverSelectionTryOnce",
    "srvMaxHosts",
    "srvServiceName",
    "ssl",
    "tls",
    "tlsAllowInvalidCertificates",
    "tlsAllowInvalidHostnames",
    "tlsCAFile",
    "tlsCertificateKeyFile",
    "tlsCertificateKeyFilePassword",
    "tlsDisableCertificateRevocationCheck",
    "tlsInsecure",
    "w",
    "waitQueueTimeoutMS",
    "wTimeoutMS",
    "gssapiServiceName",
    "server_api",
    "driver",
    "tlsCRLFile",
];

/// A connection string ready for the driver: the URI without the options that have no effect,
/// and their names.
pub struct Prepared {
    pub uri: String,
    pub set_aside: Vec<&'static str>,
}

/// The canonical name of a known option (names are case-insensitive).
fn canonical(name: &str, among: &[&'static str]) -> Option<&'static str> {
    among.iter().copied().find(|k| k.eq_ignore_ascii_case(name))
}

/// The URI up to its options, and its options (`key=value`): split on `&`, or on `;` when no `&`
/// separates them (PyMongo reads either, not a mix).
fn split(uri: &str) -> (&str, Vec<&str>) {
    match uri.split_once('?') {
        Some((base, query)) => {
            let separator = if query.contains('&') { '&' } else { ';' };
            (
                base,
                query.split(separator).filter(|o| !o.is_empty()).collect(),
            )
        }
        None => (uri, Vec::new()),
    }
}

fn with_options(base: &str, options: &[&str]) -> String {
    if options.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", options.join("&"))
    }
}

/// Sets aside the options of [`NO_EFFECT`], and separates the others with `&`. The URI is
/// otherwise unchanged, and left whole when what follows its first `?` cannot be options (an `@`
/// or `/` there: an unescaped `?` in the credentials, which the driver then refuses).
pub fn prepare(uri: &str) -> Prepared {
    let unchanged = || Prepared {
        uri: uri.to_string(),
        set_aside: Vec::new(),
    };
    if uri
        .split_once('?')
        .is_none_or(|(_, query)| query.contains(['@', '/']))
    {
        return unchanged();
    }
    let (base, options) = split(uri);
    let mut set_aside = Vec::new();
    let mut kept = Vec::new();
    for option in options {
        let name = option.split_once('=').map_or(option, |(k, _)| k);
        match canonical(name, NO_EFFECT) {
            Some(known) => {
                if !set_aside.contains(&known) {
                    set_aside.push(known);
                }
            }
            None => kept.push(option),
        }
    }
    Prepared {
        uri: with_options(base, &kept),
        set_aside,
    }
}

/// Why the driver refuses `uri` (already [`prepare`]d), as far as can be said without echoing
/// anything the user wrote but a known option's name: the first option that is refused on its
/// own, or a near known name for an unknown one.
pub fn refusal(uri: &str) -> String {
    let (base, options) = split(uri);
    if ConnectionString::parse(base).is_err() {
        return format!(
            "{UNPARSABLE_URI}: its hosts or credentials cannot be read (special characters in a \
             user name or password must be percent-encoded)"
        );
    }
    for option in &options {
        if ConnectionString::parse(with_options(base, &[option])).is_ok() {
            continue;
        }
        let name = option.split_once('=').map_or(*option, |(k, _)| k);
        if let Some(known) = canonical(name, KNOWN) {
            return format!(
                "{UNPARSABLE_URI}: its option {known} is refused (a value out of range, or an \
                 option that needs another; see MongoDB's connection string options)"
            );
        }
        let hint = handoff_domain::text::did_you_mean(name, KNOWN.iter().chain(NO_EFFECT).copied());
        return format!("{UNPARSABLE_URI}: it has an option no driver knows{hint}");
    }
    format!("{UNPARSABLE_URI}: its options cannot be used together")
}

#[cfg(test)]
mod tests;
