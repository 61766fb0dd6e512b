use super::*;
use bson::doc;

fn redacted(paths: &[&str], mut event: Document) -> Document {
    for path in paths {
        Redaction::parse(path)
            .expect("a valid path")
            .apply(&mut event);
    }
    event
}

const R: &str = REDACTED;

#[test]
fn a_field_is_hidden_in_every_document_the_event_carries() {
    let event = doc! {
        "_id": {"_data": "8200"},
        "operationType": "replace",
        "documentKey": {"_id": 1, "email": "key@example.com"},
        "fullDocument": {"_id": 1, "email": "new@example.com", "n": 1},
        "fullDocumentBeforeChange": {"_id": 1, "email": "old@example.com", "n": 0},
    };
    for spelling in [
        "fullDocument.email",
        "email",
        "fullDocumentBeforeChange.email",
    ] {
        assert_eq!(
            redacted(&[spelling], event.clone()),
            doc! {
                "_id": {"_data": "8200"},
                "operationType": "replace",
                "documentKey": {"_id": 1, "email": R},
                "fullDocument": {"_id": 1, "email": R, "n": 1},
                "fullDocumentBeforeChange": {"_id": 1, "email": R, "n": 0},
            },
            "{spelling}"
        );
    }
}

#[test]
fn an_update_description_is_redacted_by_its_dotted_keys() {
    let event = doc! {
        "_id": {"_data": "8200"},
        "operationType": "update",
        "updateDescription": {
            "updatedFields": {
                "email": "a@example.com",
                "profile.email": "b@example.com",
                "profile.name": "kept",
                "contact": {"email": "c@example.com", "phone": "kept"},
                "items.0.email": "d@example.com",
                "items.1": {"email": "e@example.com", "sku": "kept"},
                "items": [{"email": "f@example.com"}, {"sku": "kept"}],
                "emailCount": 3,
            },
            "removedFields": ["email"],
            "truncatedArrays": [],
        },
    };
    let out = redacted(
        &[
            "fullDocument.email",
            "profile.email",
            "contact.email",
            "items.email",
        ],
        event,
    );
    assert_eq!(
        out.get_document("updateDescription").unwrap(),
        &doc! {
            "updatedFields": {
                "email": R,
                "profile.email": R,
                "profile.name": "kept",
                "contact": {"email": R, "phone": "kept"},
                "items.0.email": R,
                "items.1": {"email": R, "sku": "kept"},
                "items": [{"email": R}, {"sku": "kept"}],
                "emailCount": 3,
            },
            "removedFields": ["email"],
            "truncatedArrays": [],
        }
    );
}

#[test]
fn a_key_inside_a_hidden_field_is_hidden_whole() {
    let event = doc! {
        "updateDescription": {"updatedFields": {"profile.address.city": "Paris", "profiles": 1}},
        "fullDocument": {"profile": {"address": {"city": "Paris"}}, "profiles": 1},
    };
    assert_eq!(
        redacted(&["profile"], event),
        doc! {
            "updateDescription": {"updatedFields": {"profile.address.city": R, "profiles": 1}},
            "fullDocument": {"profile": R, "profiles": 1},
        }
    );
}

#[test]
fn arrays_are_followed_as_mongodb_follows_them() {
    let event = doc! {
        "fullDocument": {"items": [{"email": "a@x"}, {"email": "b@x"}, "plain", {"sku": 1}],
                         "lines": [{"email": "c@x"}, {"email": "d@x"}]},
    };
    assert_eq!(
        redacted(&["items.email", "lines.1.email"], event),
        doc! {
            "fullDocument": {"items": [{"email": R}, {"email": R}, "plain", {"sku": 1}],
                             "lines": [{"email": "c@x"}, {"email": R}]},
        }
    );
}

#[test]
fn missing_fields_and_other_parts_of_the_event_are_left_as_they_are() {
    let event = doc! {
        "_id": {"_data": "8200"},
        "ns": {"db": "shop", "coll": "orders"},
        "fullDocument": {"n": 1, "email": null},
    };
    assert_eq!(
        redacted(
            &["fullDocument.missing.deep", "ns.coll", "n.deeper"],
            event.clone()
        ),
        event
    );
}

#[test]
fn the_token_and_whole_documents_cannot_be_named() {
    for bad in [
        "_id",
        "_id._data",
        "a..b",
        "",
        ".email",
        "fullDocument",
        "updateDescription.updatedFields",
    ] {
        assert!(Redaction::parse(bad).is_err(), "{bad:?}");
    }
    assert!(
        Redaction::parse("_id")
            .unwrap_err()
            .to_string()
            .contains("fullDocument._id")
    );
    // The document's own _id can be hidden (the token is not touched).
    let out = redacted(
        &["fullDocument._id"],
        doc! {"_id": {"_data": "8200"}, "documentKey": {"_id": 7}},
    );
    assert_eq!(
        out,
        doc! {"_id": {"_data": "8200"}, "documentKey": {"_id": R}}
    );
}

#[test]
fn nested_arrays_and_dotted_field_names_are_followed_too() {
    let event = doc! {
        "fullDocument": {
            "items": [[{"email": "a@x"}], [[{"email": "b@x"}]]],
            "profile.email": "c@x",
            "profile": {"email": "d@x", "name.first": "kept"},
        },
    };
    assert_eq!(
        redacted(&["items.email", "profile.email"], event),
        doc! {
            "fullDocument": {
                "items": [[{"email": R}], [[{"email": R}]]],
                "profile.email": R,
                "profile": {"email": R, "name.first": "kept"},
            },
        }
    );
}
