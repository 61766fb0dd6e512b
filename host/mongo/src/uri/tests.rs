use super::*;

/// Every option PyMongo accepts in a URI, with a value it accepts: the driver takes each, once
/// what has no effect here is set aside.
const PYMONGO_ACCEPTS: &[&str] = &[
    "appname=x",
    "authsource=admin",
    "compressors=zlib,snappy",
    "connect=false",
    "connecttimeoutms=1000",
    "datetime_conversion=datetime_auto",
    "directconnection=false",
    "fsync=true",
    "heartbeatfrequencyms=10000",
    "journal=true",
    "loadbalanced=false",
    "localthresholdms=15",
    "maxconnecting=2",
    "maxidletimems=100",
    "maxpoolsize=5",
    "minpoolsize=0",
    "readconcernlevel=majority",
    "readpreference=primary",
    "retryreads=true",
    "retrywrites=true",
    "servermonitoringmode=poll",
    "serverselectiontimeoutms=100",
    "sockettimeoutms=1000",
    "ssl=false",
    "timeoutms=1000",
    "tls=false",
    "tlsallowinvalidcertificates=false",
    "tlsinsecure=false",
    "tz_aware=true",
    "unicode_decode_error_handler=strict",
    "uuidRepresentation=standard",
    "w=majority",
    "waitqueuemultiple=2",
    "waitqueuetimeoutms=100",
    "wtimeoutms=100",
    "zlibcompressionlevel=5",
    "tlsDisableOCSPEndpointCheck=true",
];

#[test]
fn every_option_pymongo_accepts_is_taken_or_set_aside() {
    for option in PYMONGO_ACCEPTS {
        let uri = format!("mongodb://db1:27017,db2:27017/?replicaSet=rs0&{option}");
        let prepared = prepare(&uri);
        assert!(
            ConnectionString::parse(&prepared.uri).is_ok(),
            "{option}: {}",
            refusal(&prepared.uri)
        );
    }
}

#[test]
fn what_is_set_aside_is_named_once_and_the_rest_kept_in_order() {
    let prepared = prepare(
        "mongodb://u:p%3Fw@db1/shop?uuidRepresentation=standard&replicaSet=rs0&connect=false\
         &UUIDREPRESENTATION=javaLegacy&appName=a",
    );
    assert_eq!(prepared.set_aside, ["uuidRepresentation", "connect"]);
    assert_eq!(
        prepared.uri,
        "mongodb://u:p%3Fw@db1/shop?replicaSet=rs0&appName=a"
    );
    // Options separated by `;` reach the driver separated by `&`, as PyMongo reads them; a URI
    // with nothing to set aside is otherwise passed on as written.
    let semicolons = prepare("mongodb://db1/?replicaSet=rs0;w=majority");
    assert_eq!(semicolons.uri, "mongodb://db1/?replicaSet=rs0&w=majority");
    assert!(semicolons.set_aside.is_empty());
    assert!(ConnectionString::parse(&semicolons.uri).is_ok());
    let plain = "mongodb://db1/?replicaSet=rs0&w=majority";
    assert_eq!(prepare(plain).uri, plain);
    // With `&` separators a `;` belongs to a value.
    assert_eq!(
        prepare("mongodb://db1/?appName=a;b&connect=false").uri,
        "mongodb://db1/?appName=a;b"
    );
    // An unescaped `?` in a password: what follows is no query, and nothing is rewritten (the
    // driver refuses it, and the refusal echoes none of it).
    let password = "mongodb://admin:12345?connect=x@db.invalid/";
    assert_eq!(prepare(password).uri, password);
    assert!(prepare(password).set_aside.is_empty());
    let refused = refusal(password);
    assert!(
        !refused.contains("12345") && !refused.contains("admin"),
        "{refused}"
    );
}

#[test]
fn a_refusal_names_the_known_option_and_never_a_value() {
    let refused = refusal("mongodb://db1/?replicaSet=rs0&maxStalenessSeconds=5");
    assert!(refused.contains("maxStalenessSeconds"), "{refused}");
    assert!(!refused.contains('5'), "{refused}");
    let typo = refusal("mongodb://db1/?replicaSte=rs0");
    assert!(typo.contains("did you mean replicaSet"), "{typo}");
    assert!(!typo.contains("replicaSte"), "{typo}");
    let unknown = refusal("mongodb://db1/?zzzzzz=S3cret");
    assert!(unknown.ends_with("no driver knows"), "{unknown}");
    // A password with an unencoded `?` never reaches the message, as an option or otherwise.
    let bad = refusal("mongodb://alice:27017?S3cret@db1/");
    assert!(!bad.contains("S3cret") && !bad.contains("alice"), "{bad}");
    let hosts = refusal("mongodb://alice:s3cr3t@/db");
    assert!(hosts.contains("hosts or credentials"), "{hosts}");
    assert!(!hosts.contains("s3cr3t"), "{hosts}");
}
