use super::*;

fn refused(text: &str) -> String {
    parse_pipeline(text).expect_err(text)
}

#[test]
fn the_stages_a_change_stream_allows_pass() {
    let pipeline = parse_pipeline(
        r#"[
            {"$match": {"operationType": {"$in": ["insert", "update"]}}},
            {"$project": {"fullDocument.secret": 0}},
            {"$project": {"operationType": 1, "fullDocument.total": 1, "ns": 1}},
            {"$addFields": {"tenant": "$fullDocument.tenant"}},
            {"$set": {"seen": {"$literal": true}}},
            {"$unset": ["updateDescription", "fullDocument.big"]},
            {"$unset": "tenant"},
            {"$replaceWith": {"$mergeObjects": ["$fullDocument", {"_id": "$_id", "operationType": "$operationType"}]}},
            {"$replaceRoot": {"newRoot": {"_id": "$_id", "operationType": "$operationType", "doc": "$fullDocument"}}},
            {"$redact": "$$KEEP"},
            {"$match": {"fullDocument.when": {"$gt": {"$date": "2026-01-01T00:00:00Z"}}}}
        ]"#,
    )
    .unwrap();
    assert_eq!(pipeline.len(), 11);
    assert!(matches!(
        pipeline[10]
            .get_document("$match")
            .unwrap()
            .get_document("fullDocument.when")
            .unwrap()
            .get("$gt"),
        Some(Bson::DateTime(_))
    ));
}

#[test]
fn other_stages_and_shapes_are_refused() {
    for (text, says) in [
        (r#"[{"$group": {"_id": null}}]"#, "$group is not allowed"),
        (r#"[{"$lookup": {}}]"#, "not allowed"),
        (r#"[{"$changeStreamSplitLargeEvent": {}}]"#, "not allowed"),
        (
            r#"[{"$match": {}, "$project": {"a": 1}}]"#,
            "exactly one field",
        ),
        (r#"[{}]"#, "exactly one field"),
        (
            r#"[{"$replaceRoot": {"root": {"_id": "$_id"}}}]"#,
            "newRoot",
        ),
        (r#"[{"$addFields": 1}]"#, "takes a document"),
        (r#"[{"$unset": 1}]"#, "field path"),
        (r#"[{"$match": {"a\u0000b": 1}}]"#, "cannot be encoded"),
        (r#"[1]"#, "not a document"),
        (r#"{"$match": {}}"#, "JSON array"),
        (r#"[{"$match": "#, "not JSON"),
        (
            r#"[{"$match": {"a": {"$date": "not a date"}}}]"#,
            "Extended JSON",
        ),
    ] {
        let error = refused(text);
        assert!(error.contains(says), "{text}: {error}");
    }
    let many = format!("[{}]", vec![r#"{"$match": {}}"#; MAX_STAGES + 1].join(","));
    assert!(refused(&many).contains("more than"));
    assert!(refused(&" ".repeat(MAX_PIPELINE_BYTES + 1)).contains("KiB"));
}

#[test]
fn a_pipeline_that_changes_the_token_or_the_operation_type_is_refused() {
    for text in [
        r#"[{"$project": {"_id": 0}}]"#,
        r#"[{"$project": {"_id": "$documentKey"}}]"#,
        r#"[{"$project": {"_id._data": 1, "operationType": 1}}]"#,
        r#"[{"$project": {"_id": {"_data": 1}}}]"#,
        r#"[{"$project": {"operationType": 0}}]"#,
        r#"[{"$project": {"fullDocument": 1}}]"#,
        r#"[{"$project": {"doc": "$fullDocument"}}]"#,
        r#"[{"$project": {"_id": 1}}]"#,
        r#"[{"$project": {}}]"#,
        r#"[{"$addFields": {"_id": 1}}]"#,
        r#"[{"$set": {"_id._data": "x"}}]"#,
        r#"[{"$set": {"operationType": "insert"}}]"#,
        r#"[{"$unset": "_id"}]"#,
        r#"[{"$unset": ["a", "operationType"]}]"#,
        r#"[{"$unset": "_id._typeBits"}]"#,
        r#"[{"$replaceRoot": {"newRoot": "$fullDocument"}}]"#,
        r#"[{"$replaceWith": "$fullDocument"}]"#,
        r#"[{"$replaceWith": {"_id": "$documentKey", "operationType": "$operationType"}}]"#,
        r#"[{"$replaceWith": {"$mergeObjects": [{"_id": "$_id", "operationType": "$operationType"}, "$fullDocument"]}}]"#,
    ] {
        let error = refused(text);
        assert!(
            error.contains("_id") || error.contains("operationType"),
            "{text}: {error}"
        );
    }
    // Fields that merely start with a protected name are not protected.
    assert!(parse_pipeline(r#"[{"$set": {"_identity": 1, "operationTypes": 2}}]"#).is_ok());
}

#[test]
fn the_stored_form_round_trips_and_fills_missing_fields_with_the_baseline() {
    let config = StreamConfig {
        scope: Scope::Database,
        full_document: FullDocument::Required,
        before_change: BeforeChange::WhenAvailable,
        pipeline: parse_pipeline(r#"[{"$match": {"operationType": "insert"}}]"#).unwrap(),
        ..StreamConfig::default()
    };
    let stored = config.to_document();
    assert_eq!(StreamConfig::from_document(&stored).unwrap(), config);
    assert_eq!(
        StreamConfig::from_document(&doc! {}).unwrap(),
        StreamConfig::default()
    );
    assert!(StreamConfig::from_document(&doc! { "scope": "galaxy" }).is_err());
    assert!(StreamConfig::from_document(&doc! { "pipeline": [1] }).is_err());
    assert!(StreamConfig::from_document(&doc! { "fullDocument": 1 }).is_err());
}

#[test]
fn digests_differ_exactly_when_the_stream_differs() {
    let base = StreamConfig::default();
    assert_eq!(base.digest(), StreamConfig::default().digest());
    assert!(base.digest().starts_with("sha256:") && base.digest().len() == 7 + 64);
    let mut images = base.clone();
    images.before_change = BeforeChange::Required;
    assert_ne!(base.digest(), images.digest());
    let mut filtered = base.clone();
    filtered.pipeline = vec![doc! { "$match": { "a": 1 } }];
    assert_ne!(base.digest(), filtered.digest());
    let lines = filtered.differences(&images);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with("fullDocumentBeforeChange: checkpoint required, this run off"));
    assert!(lines[1].starts_with("pipeline: checkpoint 0 stage(s)"));
    assert!(base.differences(&StreamConfig::default()).is_empty());
    // A stage holding NaN is the same stage as itself.
    let nan = StreamConfig {
        pipeline: parse_pipeline(r#"[{"$match": {"a": {"$numberDouble": "NaN"}}}]"#).unwrap(),
        ..StreamConfig::default()
    };
    let stored = StreamConfig::from_document(&nan.to_document()).unwrap();
    assert!(nan.differences(&stored).is_empty());
}

#[test]
fn partitions_parse_and_cover_every_hash_once() {
    assert_eq!(Partition::parse("0/1").unwrap(), None);
    assert_eq!(
        Partition::parse(" 2 / 4 ").unwrap(),
        Some(Partition { index: 2, count: 4 })
    );
    for bad in ["4/4", "1/0", "-1/4", "a/b", "3", "0/1025", ""] {
        assert!(Partition::parse(bad).is_err(), "{bad}");
    }
    for hash in [i64::MIN, -7, -1, 0, 1, 763_543_691_661_428_748, i64::MAX] {
        let bucket = Partition::of_hash(hash, 3);
        assert!(bucket < 3);
        // The server's expression: ((hash mod n) + n) mod n, with mod truncated as $mod is.
        assert_eq!(i64::from(bucket), ((hash % 3) + 3) % 3, "{hash}");
    }
    let stage = Partition { index: 1, count: 3 }.stage();
    let clauses = stage
        .get_document("$match")
        .unwrap()
        .get_array("$or")
        .unwrap();
    assert_eq!(
        clauses[0],
        Bson::Document(doc! { "operationType": "invalidate" })
    );
}

#[test]
fn partition_and_split_are_part_of_the_configuration() {
    let base = StreamConfig::default();
    let mut shaped = base.clone();
    shaped.partition = Some(Partition { index: 1, count: 4 });
    shaped.split_large_events = true;
    assert_ne!(base.digest(), shaped.digest());
    assert_eq!(
        StreamConfig::from_document(&shaped.to_document()).unwrap(),
        shaped
    );
    let lines = shaped.differences(&base);
    assert_eq!(
        lines,
        [
            "partition: checkpoint none, this run 1/4",
            "splitLargeEvents: checkpoint false, this run true"
        ]
    );
    let stages = shaped.stages(&StateCollections::new("db", &["cp"]));
    assert_eq!(stages.len(), 3);
    assert_eq!(
        stages[1..],
        [
            doc! { "$unset": "splitEvent" },
            doc! { "$changeStreamSplitLargeEvent": {} }
        ]
    );
    for bad in [
        doc! { "fromTheFuture": true },
        doc! { "partition": { "index": 4, "count": 4 } },
        doc! { "partition": { "index": 0 } },
        doc! { "partition": 3 },
        doc! { "splitLargeEvents": "yes" },
    ] {
        assert!(StreamConfig::from_document(&bad).is_err(), "{bad}");
    }
}

#[test]
fn wide_streams_leave_out_the_state_collections_and_let_registry_events_through() {
    let own = StateCollections::new("shop", &["cp", "out"]);
    let mut config = StreamConfig {
        pipeline: vec![doc! { "$match": { "operationType": "insert" } }],
        ..StreamConfig::default()
    };
    let keeps_invalidations = doc! { "$match": { "$or": [ { "operationType": "invalidate" }, { "operationType": "insert" } ] } };
    assert_eq!(
        config.stages(&own),
        std::slice::from_ref(&keeps_invalidations)
    );
    assert_eq!(config.source("shop", "orders"), "shop.orders");
    config.scope = Scope::Database;
    config.partition = Some(Partition { index: 1, count: 2 });
    let stages = config.stages(&own);
    assert_eq!(stages.len(), 3);
    assert_eq!(stages[0], doc! { "$match": { "$nor": own.clauses() } });
    // Every filter lets the registries' events through to the host.
    let passes = [
        Bson::Document(doc! { "operationType": "invalidate" }),
        Bson::Document(doc! { "ns.coll": REGISTRY }),
    ];
    let partition = stages[1].get_document("$match").unwrap();
    assert_eq!(partition.get_array("$or").unwrap()[..2], passes);
    assert_eq!(
        stages[2],
        doc! { "$match": { "$or": [
            { "operationType": "invalidate" }, { "ns.coll": REGISTRY }, { "operationType": "insert" }
        ] } }
    );
    // A $redact keeps invalidations and registry events whatever its expression says.
    config.partition = None;
    config.pipeline = vec![doc! { "$redact": "$$PRUNE" }];
    assert_eq!(
        config.stages(&own)[1],
        doc! { "$redact": { "$cond": [
            { "$or": [
                { "$eq": ["$operationType", "invalidate"] },
                { "$eq": ["$$ROOT.ns.coll", REGISTRY] },
            ] },
            "$$KEEP",
            "$$PRUNE"
        ] } }
    );
    assert_eq!(config.source("shop", "orders"), "shop");
    config.scope = Scope::Deployment;
    assert_eq!(config.source("shop", "orders"), DEPLOYMENT_SOURCE);
}

#[test]
fn a_wide_streams_pipeline_keeps_the_namespace() {
    for text in [
        r#"[{"$project": {"ns": 0}}]"#,
        r#"[{"$project": {"operationType": 1, "fullDocument": 1}}]"#,
        r#"[{"$project": {"ns.coll": 1, "operationType": 1}}]"#,
        r#"[{"$unset": "ns.db"}]"#,
        r#"[{"$set": {"ns": {"db": "x", "coll": "y"}}}]"#,
        r#"[{"$replaceWith": {"$mergeObjects": ["$fullDocument", {"_id": "$_id", "operationType": "$operationType"}]}}]"#,
    ] {
        let pipeline = parse_pipeline(text).expect(text);
        let error = check_keeps_namespace(&pipeline).expect_err(text);
        assert!(error.contains("ns"), "{text}: {error}");
    }
    for text in [
        r#"[{"$project": {"operationType": 1, "ns": 1, "fullDocument.total": 1}}]"#,
        r#"[{"$project": {"fullDocument.secret": 0}}]"#,
        r#"[{"$match": {"ns.coll": {"$ne": "logs"}}}]"#,
        r#"[{"$replaceWith": {"$mergeObjects": ["$fullDocument", {"_id": "$_id", "operationType": "$operationType", "ns": "$ns"}]}}]"#,
    ] {
        let pipeline = parse_pipeline(text).expect(text);
        assert_eq!(check_keeps_namespace(&pipeline), Ok(()), "{text}");
    }
}
