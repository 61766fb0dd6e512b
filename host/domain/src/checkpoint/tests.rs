use super::*;

const RS: &str = "65f000000000000000000001";

#[test]
fn a_new_checkpoint_validates() {
    let c = validate(&initial("c", "db.c", RS), "db.c", RS).unwrap();
    assert_eq!(c, Checkpoint::at(None, Mode::ResumeAfter));
    let bound = validate(
        &initial_bound("c", "db.c", RS, &StreamConfig::default()),
        "db.c",
        RS,
    )
    .unwrap();
    assert_eq!(bound.revision, Some(0));
    assert_eq!(bound.config, Some(StreamConfig::default()));
}

#[test]
fn mismatches_and_malformed_shapes_are_refused() {
    let mut other_rs = initial("c", "db.c", RS);
    other_rs.insert("replicaSetId", "65f000000000000000000002");
    assert!(
        matches!(validate(&initial("c", "db.x", RS), "db.c", RS), Err(HandoffError::Mismatch(m)) if m.contains("another source"))
    );
    assert!(
        matches!(validate(&other_rs, "db.c", RS), Err(HandoffError::Mismatch(m)) if m.contains("another replica set"))
    );
    for (key, value) in [
        ("token", Bson::String("8200".into())),
        ("token", Bson::Int32(1)),
        ("mode", Bson::String("startAtOperationTime".into())),
        ("mode", Bson::Int32(1)),
        ("revision", Bson::Int64(-1)),
        ("revision", Bson::Int64(i64::MAX)),
        ("revision", Bson::String("1".into())),
        ("owner", Bson::String("someone".into())),
        ("leaseUntil", Bson::DateTime(DateTime::now())),
        ("config", Bson::String("{}".into())),
        ("config", Bson::Document(doc! { "scope": "galaxy" })),
    ] {
        let mut c = initial("c", "db.c", RS);
        c.insert(key, value);
        assert!(
            matches!(
                validate(&c, "db.c", RS),
                Err(HandoffError::MalformedCheckpoint(_))
            ),
            "{key}"
        );
    }
}

#[test]
fn tokens_of_another_shape_are_malformed() {
    let binary = Bson::Binary(bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic,
        bytes: vec![1],
    });
    for token in [
        doc! {},
        doc! {"_data": ""},
        doc! {"_data": "82zz"},
        doc! {"_data": 82},
        doc! {"_data": "82", "extra": 1},
        doc! {"_data": "82", "_typeBits": "x"},
        doc! {"_data": "8".repeat(MAX_TOKEN_DATA + 1)},
        doc! {"_typeBits": binary.clone()},
    ] {
        let mut c = initial("c", "db.c", RS);
        c.insert("token", token.clone());
        assert!(
            matches!(
                validate(&c, "db.c", RS),
                Err(HandoffError::MalformedCheckpoint(_))
            ),
            "{token}"
        );
    }
    let mut c = initial("c", "db.c", RS);
    c.insert("token", doc! {"_data": "826AE70DA0", "_typeBits": binary});
    assert!(validate(&c, "db.c", RS).unwrap().token.is_some());
}

#[test]
fn a_missing_mode_means_resume_after() {
    let mut c = initial("c", "db.c", RS);
    c.remove("mode");
    c.insert("token", doc! {"_data": "82"});
    let loaded = validate(&c, "db.c", RS).unwrap();
    assert_eq!(loaded.mode, Mode::ResumeAfter);
    assert_eq!(loaded.token, Some(doc! {"_data": "82"}));
}

fn lease(owner: &str) -> Lease {
    Lease {
        owner: owner.into(),
        duration: std::time::Duration::from_secs(60),
    }
}

#[test]
fn a_live_lease_of_another_run_is_a_conflict_and_an_expired_one_is_taken_over() {
    let now = DateTime::from_millis(1_000_000);
    let mut loaded = Checkpoint::at(None, Mode::ResumeAfter);
    loaded.revision = Some(3);
    loaded.holder = Some(Holder {
        owner: "handoff@other:1:2".into(),
        until: DateTime::from_millis(1_000_001),
    });
    let config = StreamConfig::default();
    let mine = lease("handoff@me:1:1");
    let binding = |now| Binding {
        config: &config,
        accept_change: None,
        lease: &mine,
        now,
    };
    let refused = claim(&loaded, &binding(now)).unwrap_err();
    assert!(matches!(refused, HandoffError::Conflict(_)), "{refused}");
    assert!(
        refused.to_string().contains("handoff@other:1:2"),
        "{refused}"
    );
    let taken = claim(&loaded, &binding(DateTime::from_millis(1_000_001))).unwrap();
    assert_eq!(taken.seen_revision, Some(3));
    assert_eq!(taken.set.get_str("owner").unwrap(), "handoff@me:1:1");
    assert_eq!(
        taken.set.get_datetime("leaseUntil").unwrap(),
        &DateTime::from_millis(1_000_001 + 60_000)
    );
    assert_eq!(taken.set.get_str("configDigest").unwrap(), config.digest());
    assert!(taken.change.is_none());
    // Its own lease (a second claim of one process) is no conflict.
    loaded.holder = Some(Holder {
        owner: mine.owner.clone(),
        until: DateTime::from_millis(2_000_000),
    });
    assert!(claim(&loaded, &binding(now)).is_ok());
}

#[test]
fn another_configuration_is_a_mismatch_unless_accepted_and_then_recorded() {
    let now = DateTime::from_millis(5);
    // A checkpoint the baseline created has the baseline's configuration.
    let baseline = Checkpoint::at(None, Mode::ResumeAfter);
    let images = StreamConfig {
        before_change: crate::config::BeforeChange::Required,
        ..StreamConfig::default()
    };
    let mine = lease("me");
    let refused = claim(
        &baseline,
        &Binding {
            config: &images,
            accept_change: None,
            lease: &mine,
            now,
        },
    )
    .unwrap_err();
    assert!(matches!(refused, HandoffError::Mismatch(_)), "{refused}");
    let text = refused.to_string();
    assert!(
        text.contains("fullDocumentBeforeChange: checkpoint off, this run required")
            && text.contains("--accept-config-change"),
        "{text}"
    );
    let accepted = claim(
        &baseline,
        &Binding {
            config: &images,
            accept_change: Some("pre-images enabled on orders"),
            lease: &mine,
            now,
        },
    )
    .unwrap();
    let change = accepted.change.expect("the change is recorded");
    assert_eq!(
        change.get_str("reason").unwrap(),
        "pre-images enabled on orders"
    );
    assert_eq!(
        change.get_str("from").unwrap(),
        StreamConfig::default().digest()
    );
    assert_eq!(change.get_str("to").unwrap(), images.digest());
    assert_eq!(change.get_str("by").unwrap(), "me");
    assert_eq!(
        accepted.set.get_document("config").unwrap(),
        &images.to_document()
    );
    // Another partition (index or count), or a partition added or removed, is refused,
    // reason or not.
    let share = |index, count| Some(Partition { index, count });
    for (recorded, other, difference) in [
        (share(0, 4), share(1, 4), "checkpoint 0/4, this run 1/4"),
        (share(0, 4), share(0, 8), "checkpoint 0/4, this run 0/8"),
        (share(0, 4), None, "checkpoint 0/4, this run none"),
        (None, share(0, 2), "checkpoint none, this run 0/2"),
    ] {
        let mut partitioned = baseline.clone();
        partitioned.config = Some(StreamConfig {
            partition: recorded,
            ..StreamConfig::default()
        });
        let other = StreamConfig {
            partition: other,
            ..StreamConfig::default()
        };
        for reason in [None, Some("more throughput")] {
            let refused = claim(
                &partitioned,
                &Binding {
                    config: &other,
                    accept_change: reason,
                    lease: &mine,
                    now,
                },
            )
            .unwrap_err();
            assert!(
                matches!(&refused, HandoffError::Mismatch(m)
                    if m.contains(difference)
                        && m.contains("part of a consumer's identity")
                        && m.contains("new consumer ID")),
                "{refused}"
            );
        }
    }
    // Within the same partition, another configuration is accepted with a reason.
    let mut partitioned = baseline.clone();
    partitioned.config = Some(StreamConfig {
        partition: share(1, 4),
        ..StreamConfig::default()
    });
    let same_share = StreamConfig {
        partition: share(1, 4),
        ..images.clone()
    };
    let accepted = claim(
        &partitioned,
        &Binding {
            config: &same_share,
            accept_change: Some("pre-images enabled on orders"),
            lease: &mine,
            now,
        },
    )
    .unwrap();
    assert!(accepted.change.is_some());
    // The same configuration with a reason changes nothing.
    let mut bound = baseline.clone();
    bound.config = Some(images.clone());
    let same = claim(
        &bound,
        &Binding {
            config: &images,
            accept_change: Some("again"),
            lease: &mine,
            now,
        },
    )
    .unwrap();
    assert!(same.change.is_none());
}

#[test]
fn a_run_records_its_policy_and_another_one_is_refused() {
    let params = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let quarantine = PolicyBinding::new("ab", &params(&[("supported", "1"), ("x", "y")]));
    // The order of the parameters does not count; their values and the digest do.
    assert_eq!(
        quarantine,
        PolicyBinding::new("ab", &params(&[("x", "y"), ("supported", "1")]))
    );
    let other_params = PolicyBinding::new("ab", &params(&[("supported", "1,2")]));
    assert_ne!(quarantine, other_params);
    // No confusion of key and value boundaries.
    assert_ne!(
        PolicyBinding::new("ab", &params(&[("a", "bc")])),
        PolicyBinding::new("ab", &params(&[("ab", "c")]))
    );

    let mut stored = initial("c", "db.o", "rs");
    stored.insert("policy", quarantine.document());
    let loaded = validate(&stored, "db.o", "rs").unwrap();
    assert_eq!(loaded.policy.as_ref(), Some(&quarantine));

    assert!(check_policy(&loaded, &quarantine, "backfill").is_ok());
    let refused = check_policy(&loaded, &other_params, "backfill").unwrap_err();
    assert!(matches!(refused, HandoffError::Mismatch(_)), "{refused}");
    assert!(
        refused.to_string().contains("other parameters"),
        "{refused}"
    );
    let default = PolicyBinding::new("cd", &[]);
    let refused = check_policy(&loaded, &default, "reconcile").unwrap_err();
    assert!(refused.to_string().contains("policy cd"), "{refused}");
    // Before any run recorded one, any policy is taken.
    let fresh = Checkpoint::at(None, Mode::ResumeAfter);
    assert!(check_policy(&fresh, &default, "backfill").is_ok());
    // A policy field of another shape is a malformed checkpoint.
    stored.insert("policy", "ab");
    assert!(matches!(
        validate(&stored, "db.o", "rs"),
        Err(HandoffError::MalformedCheckpoint(_))
    ));
}

#[test]
fn each_claim_numbers_its_run_and_a_bad_counter_starts_again() {
    let stored = initial_bound("c", "db.coll", "rs", &StreamConfig::default());
    let loaded = validate(&stored, "db.coll", "rs").unwrap();
    assert_eq!(loaded.runs, 0);
    let lease = crate::Lease::new(std::time::Duration::from_secs(60));
    let binding = Binding {
        config: &StreamConfig::default(),
        accept_change: None,
        lease: &lease,
        now: bson::DateTime::now(),
    };
    let claim = claim(&loaded, &binding).unwrap();
    assert_eq!(claim.run, 1);
    assert_eq!(claim.set.get_i64(crate::history::RUNS_FIELD).unwrap(), 1);
    let mut counted = stored.clone();
    counted.insert(crate::history::RUNS_FIELD, 41_i64);
    let loaded = validate(&counted, "db.coll", "rs").unwrap();
    assert_eq!(super::claim(&loaded, &binding).unwrap().run, 42);
    let mut typed = stored.clone();
    typed.insert(crate::history::RUNS_FIELD, 7.0_f64);
    assert_eq!(validate(&typed, "db.coll", "rs").unwrap().runs, 7);
    for bad in [
        bson::Bson::Int64(-1),
        bson::Bson::String("x".into()),
        bson::Bson::Int64(i64::MAX),
        bson::Bson::Double(1.5),
        bson::Bson::Double(f64::NAN),
    ] {
        let mut corrupted = stored.clone();
        corrupted.insert(crate::history::RUNS_FIELD, bad.clone());
        let loaded = validate(&corrupted, "db.coll", "rs").expect("a bad counter stops no run");
        assert_eq!(loaded.runs, 0, "{bad:?}");
    }
}

const CLUSTER: &str = "66a000000000000000000001";

#[test]
fn a_cluster_checkpoint_is_pinned_by_its_cluster_id_and_never_moves_to_another_deployment() {
    let cluster = Pin::ShardedCluster(CLUSTER);
    let created = initial("c", "db.c", cluster);
    assert_eq!(created.get_str("clusterId").ok(), Some(CLUSTER));
    assert!(!created.contains_key("replicaSetId"));
    assert!(validate(&created, "db.c", cluster).is_ok());
    let mismatch = |stored: &Document, pin: Pin<'_>| match validate(stored, "db.c", pin) {
        Err(HandoffError::Mismatch(m)) => m,
        other => panic!("not a mismatch: {other:?}"),
    };
    // Another cluster.
    let other = mismatch(&created, Pin::ShardedCluster("66a000000000000000000002"));
    assert!(other.contains("another sharded cluster"), "{other}");
    // A cluster's checkpoint on a replica set, even one whose ID is the cluster's.
    let moved = mismatch(&created, Pin::ReplicaSet(CLUSTER));
    assert!(
        moved.contains("belongs to a sharded cluster, and this deployment is a replica set"),
        "{moved}"
    );
    // A replica set's checkpoint on a cluster.
    let moved = mismatch(&initial("c", "db.c", RS), Pin::ShardedCluster(RS));
    assert!(
        moved.contains("belongs to a replica set, and this deployment is a sharded cluster"),
        "{moved}"
    );
    // A checkpoint naming neither is another deployment's, whichever this is.
    let mut neither = created.clone();
    neither.remove("clusterId");
    assert!(mismatch(&neither, cluster).contains("another sharded cluster"));
    assert!(mismatch(&neither, Pin::ReplicaSet(RS)).contains("another replica set"));
    // Both kinds named, or one named by something other than text: malformed, whichever this is.
    let mut both = created.clone();
    both.insert("replicaSetId", RS);
    let mut typed = created.clone();
    typed.insert("clusterId", bson::oid::ObjectId::new());
    for (name, stored) in [("both", &both), ("typed", &typed)] {
        for pin in [cluster, Pin::ReplicaSet(RS)] {
            assert!(
                matches!(
                    validate(stored, "db.c", pin),
                    Err(HandoffError::MalformedCheckpoint(_))
                ),
                "{name} {pin:?}"
            );
        }
    }
}

#[test]
fn a_token_is_given_only_for_this_deployments_checkpoint() {
    let mut own = initial("c", "db.c", RS);
    assert_eq!(token_on(&own, RS).unwrap(), None, "no token yet");
    own.insert("token", doc! {"_data": "82"});
    assert_eq!(token_on(&own, RS).unwrap(), Some(&doc! {"_data": "82"}));
    let mut other = own.clone();
    other.insert("replicaSetId", "65f000000000000000000002");
    assert!(matches!(
        token_on(&other, RS),
        Err(HandoffError::Mismatch(_))
    ));
    other.remove("replicaSetId");
    other.insert("clusterId", RS);
    assert!(
        matches!(token_on(&other, RS), Err(HandoffError::Mismatch(m)) if m.contains("sharded cluster"))
    );
}
