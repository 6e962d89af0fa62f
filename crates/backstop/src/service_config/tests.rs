//! Tests of gRPC service config: the examples of gRFC A6 and gRPC's service-config document read as
//! gRPC's clients read them, every validation rule named by its JSON path, and the matching
//! order.

use crate::Code;
use crate::service_config::{
    HedgingPolicyConfig, MethodName, MethodPolicy, RetryPolicyConfig, RetryThrottling,
    ServiceConfig,
};
use std::time::Duration;

use backstop_test_support::MS;

fn one_method(method_fields: &str) -> String {
    format!(r#"{{ "methodConfig": [ {{ "name": [{{ "service": "s.S" }}], {method_fields} }} ] }}"#)
}

fn retry(policy: &str) -> String {
    one_method(&format!(r#""retryPolicy": {{ {policy} }}"#))
}

const GOOD_RETRY: &str = r#""maxAttempts": 4, "initialBackoff": ".1s", "maxBackoff": "1s",
    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#;

/// The path a rejected config names.
fn rejected(json: &str) -> String {
    ServiceConfig::from_json(json)
        .expect_err("must be rejected")
        .knob()
        .to_owned()
}

#[test]
fn the_a6_examples_read_as_written() {
    let config = ServiceConfig::from_json(
        r#"{
          "loadBalancingPolicy": "round_robin",
          "methodConfig": [
            { "name": [{ "service": "a.Retry" }],
              "waitForReady": true, "maxRequestMessageBytes": 1024,
              "retryPolicy": { "maxAttempts": 4, "initialBackoff": ".1s", "maxBackoff": "1s",
                               "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"] } },
            { "name": [{ "service": "a.Hedge" }],
              "hedgingPolicy": { "maxAttempts": 4, "hedgingDelay": ".5s",
                                 "nonFatalStatusCodes": ["UNAVAILABLE", "INTERNAL", "ABORTED"] } },
            { "name": [{ "service": "a.AllAtOnce" }],
              "hedgingPolicy": { "maxAttempts": 4, "hedgingDelay": "0s",
                                 "nonFatalStatusCodes": ["UNAVAILABLE", "INTERNAL", "ABORTED"] } }
          ],
          "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
        }"#,
    )
    .unwrap();
    assert_eq!(
        config.methods[0].policy,
        Some(MethodPolicy::Retry(RetryPolicyConfig {
            max_attempts: 4,
            initial_backoff: 100 * MS,
            max_backoff: 1000 * MS,
            backoff_multiplier: 2.0,
            retryable_status_codes: vec![Code::Unavailable],
        }))
    );
    let non_fatal = vec![Code::Unavailable, Code::Internal, Code::Aborted];
    assert_eq!(
        config.methods[1].policy,
        Some(MethodPolicy::Hedging(HedgingPolicyConfig {
            max_attempts: 4,
            hedging_delay: 500 * MS,
            non_fatal_status_codes: non_fatal.clone(),
        }))
    );
    assert_eq!(
        config.methods[2].policy,
        Some(MethodPolicy::Hedging(HedgingPolicyConfig {
            max_attempts: 4,
            hedging_delay: Duration::ZERO,
            non_fatal_status_codes: non_fatal,
        }))
    );
    assert_eq!(
        config.retry_throttling,
        Some(RetryThrottling {
            max_tokens: 10,
            token_ratio: 0.1
        })
    );
}

#[test]
fn the_most_specific_entry_wins() {
    let config = ServiceConfig::from_json(
        r#"{ "methodConfig": [
            { "name": [{}], "timeout": "1s" },
            { "name": [{ "service": "bank.Accounts" }], "timeout": "2s" },
            { "name": [{ "service": "bank.Accounts", "method": "Charge" },
                       { "service": "bank.Cards", "method": "Charge" }], "timeout": "3s" }
        ] }"#,
    )
    .unwrap();
    let timeout = |path: &str| config.method(path).and_then(|m| m.timeout);
    assert_eq!(timeout("/bank.Accounts/Charge"), Some(3000 * MS));
    assert_eq!(timeout("/bank.Cards/Charge"), Some(3000 * MS));
    assert_eq!(timeout("/bank.Accounts/GetBalance"), Some(2000 * MS));
    assert_eq!(timeout("/bank.Cards/Refund"), Some(1000 * MS));
    assert_eq!(timeout("/other.Svc/Call"), Some(1000 * MS));
    // Not a gRPC path.
    assert!(config.method("bank.Accounts/Charge").is_none());
    assert!(config.method("/justone").is_none());
    // Without a default entry, an unnamed method has none: no retries, as gRPC does.
    let narrow =
        ServiceConfig::from_json(r#"{ "methodConfig": [ { "name": [{ "service": "a.A" }] } ] }"#)
            .unwrap();
    assert!(narrow.method("/b.B/Call").is_none());
    assert_eq!(
        narrow.methods[0].names,
        [MethodName {
            service: Some("a.A".into()),
            method: None
        }]
    );
}

#[test]
fn durations_are_proto3_json() {
    let timeout = |t: &str| {
        ServiceConfig::from_json(&one_method(&format!(r#""timeout": "{t}""#)))
            .map(|c| c.methods[0].timeout.unwrap())
    };
    assert_eq!(timeout("1.5s"), Ok(1500 * MS));
    assert_eq!(timeout(".1s"), Ok(100 * MS));
    assert_eq!(timeout("0s"), Ok(Duration::ZERO));
    assert_eq!(timeout("2.000000001s"), Ok(Duration::new(2, 1)));
    assert_eq!(timeout("120s"), Ok(Duration::from_secs(120)));
    for bad in [
        "1",
        "1ms",
        "-1s",
        "1.0000000001s",
        "s",
        ".s",
        "1.5 s",
        "one s",
        "1e3s",
    ] {
        let err = timeout(bad).unwrap_err();
        assert_eq!(err.knob(), "methodConfig[0].timeout", "{bad}");
    }
    let err = ServiceConfig::from_json(&one_method(r#""timeout": 1.5"#)).unwrap_err();
    assert_eq!(err.knob(), "methodConfig[0].timeout");
}

#[test]
fn every_retry_policy_rule_names_its_path() {
    let p = "methodConfig[0].retryPolicy";
    let cases: &[(&str, &str)] = &[
        (
            r#""initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#,
            "maxAttempts",
        ),
        (
            r#""maxAttempts": 1, "initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#,
            "maxAttempts",
        ),
        (
            r#""maxAttempts": 2.5, "initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#,
            "maxAttempts",
        ),
        (
            r#""maxAttempts": 3, "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#,
            "initialBackoff",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": "0s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#,
            "initialBackoff",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": ".1s", "maxBackoff": "0s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#,
            "maxBackoff",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": ".1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#,
            "maxBackoff",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": ".1s", "maxBackoff": "1s", "retryableStatusCodes": ["UNAVAILABLE"]"#,
            "backoffMultiplier",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": 0, "retryableStatusCodes": ["UNAVAILABLE"]"#,
            "backoffMultiplier",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": -2, "retryableStatusCodes": ["UNAVAILABLE"]"#,
            "backoffMultiplier",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": 2"#,
            "retryableStatusCodes",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": []"#,
            "retryableStatusCodes",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "NOPE"]"#,
            "retryableStatusCodes[1]",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": [0]"#,
            "retryableStatusCodes[0]",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": [17]"#,
            "retryableStatusCodes[0]",
        ),
        (
            r#""maxAttempts": 3, "initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": [true]"#,
            "retryableStatusCodes[0]",
        ),
    ];
    for (fields, knob) in cases {
        assert_eq!(rejected(&retry(fields)), format!("{p}.{knob}"), "{fields}");
    }
    // Codes by number too.
    let config = ServiceConfig::from_json(&retry(
        r#""maxAttempts": 3, "initialBackoff": ".1s", "maxBackoff": "1s", "backoffMultiplier": 1.5, "retryableStatusCodes": [14, "RESOURCE_EXHAUSTED"]"#,
    ))
    .unwrap();
    let Some(MethodPolicy::Retry(r)) = &config.methods[0].policy else {
        panic!("a retry policy");
    };
    assert_eq!(
        r.retryable_status_codes,
        [Code::Unavailable, Code::ResourceExhausted]
    );
}

/// Numbers as proto3 JSON (and so gRPC C-core and grpc-go) read them: a whole number in any
/// notation or as a string, a float as a string; `null` is an absent field. A fraction where a
/// whole number belongs, or a word, is still refused by its path.
#[test]
fn numbers_and_nulls_read_as_proto3_json_reads_them() {
    let attempts = |value: &str| {
        let config = ServiceConfig::from_json(&retry(
            &GOOD_RETRY.replace("\"maxAttempts\": 4", &format!("\"maxAttempts\": {value}")),
        ))
        .unwrap_or_else(|e| panic!("{value}: {e}"));
        match &config.methods[0].policy {
            Some(MethodPolicy::Retry(r)) => r.max_attempts,
            other => panic!("{other:?}"),
        }
    };
    for (value, read) in [
        ("3", 3),
        ("3.0", 3),
        ("\"3\"", 3),
        ("1e1", 5),
        ("\"1e1\"", 5),
    ] {
        assert_eq!(attempts(value), read, "{value}");
    }
    let strings =
        retry(&GOOD_RETRY.replace("\"backoffMultiplier\": 2", "\"backoffMultiplier\": \"2\""));
    let config = ServiceConfig::from_json(&strings).unwrap();
    assert!(matches!(&config.methods[0].policy,
        Some(MethodPolicy::Retry(r)) if r.backoff_multiplier == 2.0));
    let throttled = ServiceConfig::from_json(
        r#"{ "retryThrottling": { "maxTokens": "10", "tokenRatio": "0.1" } }"#,
    )
    .unwrap();
    assert_eq!(
        throttled.retry_throttling,
        Some(RetryThrottling {
            max_tokens: 10,
            token_ratio: 0.1
        })
    );
    // `null` is absent: no entries, no timeout, no policy, no throttling.
    let nulls =
        ServiceConfig::from_json(r#"{ "methodConfig": null, "retryThrottling": null }"#).unwrap();
    assert!(nulls.methods.is_empty() && nulls.retry_throttling.is_none());
    let entry =
        ServiceConfig::from_json(&one_method(r#""timeout": null, "retryPolicy": null"#)).unwrap();
    assert_eq!(
        (entry.methods[0].timeout, &entry.methods[0].policy),
        (None, &None)
    );
    // A required field given as `null` is missing.
    assert_eq!(
        rejected(&retry(
            &GOOD_RETRY.replace("\"maxAttempts\": 4", "\"maxAttempts\": null")
        )),
        "methodConfig[0].retryPolicy.maxAttempts"
    );
    for bad in ["3.5", "\"3.5\"", "\"three\"", "true", "-1", "\" 3\""] {
        assert_eq!(
            rejected(&retry(&GOOD_RETRY.replace(
                "\"maxAttempts\": 4",
                &format!("\"maxAttempts\": {bad}")
            ))),
            "methodConfig[0].retryPolicy.maxAttempts",
            "{bad}"
        );
    }
}

#[test]
fn max_attempts_is_clamped_to_the_cap_unless_raised() {
    let seven = retry(&GOOD_RETRY.replace("\"maxAttempts\": 4", "\"maxAttempts\": 7"));
    let attempts = |config: ServiceConfig| match &config.methods[0].policy {
        Some(MethodPolicy::Retry(r)) => r.max_attempts,
        _ => panic!("a retry policy"),
    };
    assert_eq!(attempts(ServiceConfig::from_json(&seven).unwrap()), 5);
    assert_eq!(
        attempts(ServiceConfig::from_json_with_max_attempts(&seven, 10).unwrap()),
        7
    );
    for cap in [1, 11] {
        let err = ServiceConfig::from_json_with_max_attempts(&seven, cap).unwrap_err();
        assert_eq!(err.knob(), "max_attempts_cap");
    }
}

#[test]
fn every_hedging_and_throttling_rule_names_its_path() {
    let hedge = |fields: &str| one_method(&format!(r#""hedgingPolicy": {{ {fields} }}"#));
    assert_eq!(
        rejected(&hedge(r#""hedgingDelay": "1s""#)),
        "methodConfig[0].hedgingPolicy.maxAttempts"
    );
    assert_eq!(
        rejected(&hedge(r#""maxAttempts": 1"#)),
        "methodConfig[0].hedgingPolicy.maxAttempts"
    );
    assert_eq!(
        rejected(&hedge(r#""maxAttempts": 2, "hedgingDelay": "1""#)),
        "methodConfig[0].hedgingPolicy.hedgingDelay"
    );
    assert_eq!(
        rejected(&hedge(r#""maxAttempts": 2, "nonFatalStatusCodes": []"#)),
        "methodConfig[0].hedgingPolicy.nonFatalStatusCodes"
    );
    // Unset delay: all attempts at once; unset codes: every failure is fatal.
    let config = ServiceConfig::from_json(&hedge(r#""maxAttempts": 3"#)).unwrap();
    assert_eq!(
        config.methods[0].policy,
        Some(MethodPolicy::Hedging(HedgingPolicyConfig {
            max_attempts: 3,
            hedging_delay: Duration::ZERO,
            non_fatal_status_codes: vec![],
        }))
    );
    // Retry and hedging are exclusive.
    let both = one_method(&format!(
        r#""retryPolicy": {{ {GOOD_RETRY} }}, "hedgingPolicy": {{ "maxAttempts": 2 }}"#
    ));
    assert_eq!(rejected(&both), "methodConfig[0].hedgingPolicy");

    let throttle = |fields: &str| format!(r#"{{ "retryThrottling": {{ {fields} }} }}"#);
    for (fields, knob) in [
        (r#""tokenRatio": 0.1"#, "maxTokens"),
        (r#""maxTokens": 0, "tokenRatio": 0.1"#, "maxTokens"),
        (r#""maxTokens": 1001, "tokenRatio": 0.1"#, "maxTokens"),
        (r#""maxTokens": 1.5, "tokenRatio": 0.1"#, "maxTokens"),
        (r#""maxTokens": 10"#, "tokenRatio"),
        (r#""maxTokens": 10, "tokenRatio": 0"#, "tokenRatio"),
        (r#""maxTokens": 10, "tokenRatio": -0.5"#, "tokenRatio"),
        (r#""maxTokens": 10, "tokenRatio": 0.1234"#, "tokenRatio"),
    ] {
        assert_eq!(
            rejected(&throttle(fields)),
            format!("retryThrottling.{knob}"),
            "{fields}"
        );
    }
    let ok =
        ServiceConfig::from_json(&throttle(r#""maxTokens": 1000, "tokenRatio": 0.125"#)).unwrap();
    assert_eq!(
        ok.retry_throttling,
        Some(RetryThrottling {
            max_tokens: 1000,
            token_ratio: 0.125
        })
    );
}

#[test]
fn names_are_checked_and_never_repeated() {
    let dup = r#"{ "methodConfig": [
        { "name": [{ "service": "a.A", "method": "M" }] },
        { "name": [{ "service": "b.B" }, { "service": "a.A", "method": "M" }] }
    ] }"#;
    let err = ServiceConfig::from_json(dup).unwrap_err();
    assert_eq!(err.knob(), "methodConfig[1].name[1]");
    assert!(err.to_string().contains("methodConfig[0]"), "{err}");
    // Two defaults are a duplicate too.
    let two_defaults = r#"{ "methodConfig": [ { "name": [{}] }, { "name": [{}] } ] }"#;
    assert_eq!(rejected(two_defaults), "methodConfig[1].name[0]");
    let method_alone = r#"{ "methodConfig": [ { "name": [{ "method": "M" }] } ] }"#;
    assert_eq!(rejected(method_alone), "methodConfig[0].name[0].service");
    let not_string = r#"{ "methodConfig": [ { "name": [{ "service": 7 }] } ] }"#;
    assert_eq!(rejected(not_string), "methodConfig[0].name[0].service");
    assert_eq!(rejected(r#"{ "methodConfig": {} }"#), "methodConfig");
    assert_eq!(rejected("[]"), "service config");
    assert_eq!(rejected("{ nope"), "service config");
    // An empty config is valid: nothing is retried.
    assert!(ServiceConfig::from_json("{}").unwrap().methods.is_empty());
}

/// Each policy becomes the building blocks the retry layer takes: A6's backoff, the
/// retryable codes, hedging with its delay, and the throttle.
#[test]
fn policies_become_retry_policies_hedging_and_a_throttle() {
    let config = ServiceConfig::from_json(
        r#"{ "methodConfig": [
            { "name": [{ "service": "a.R" }],
              "retryPolicy": { "maxAttempts": 3, "initialBackoff": "0.2s", "maxBackoff": "2s",
                               "backoffMultiplier": 3, "retryableStatusCodes": ["UNAVAILABLE"] } },
            { "name": [{ "service": "a.H" }],
              "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.05s" } }
          ],
          "retryThrottling": { "maxTokens": 10, "tokenRatio": 2.5 } }"#,
    )
    .unwrap();
    let Some(MethodPolicy::Retry(r)) = &config.methods[0].policy else {
        panic!("a retry policy")
    };
    assert!(r.retry_policy().build().is_ok());
    assert_eq!(
        r.backoff(),
        crate::client::retry::backoff::exponential(200 * MS, 2000 * MS)
            .multiplier(3.0)
            .jitter(crate::client::retry::backoff::Jitter::Proportional(0.2))
    );
    let Some(MethodPolicy::Hedging(h)) = &config.methods[1].policy else {
        panic!("a hedging policy")
    };
    assert!(
        crate::client::retry::RetryConfig::grpc()
            .hedging(h.hedging())
            .build()
            .is_ok()
    );
    use crate::client::retry::Budget;
    let throttle = config.retry_throttling.unwrap().throttle();
    assert_eq!(throttle.balance(), 10.0);
    assert_eq!(
        rejected(r#"{ "retryThrottling": { "maxTokens": 2, "tokenRatio": 2.5 } }"#),
        "retryThrottling.tokenRatio"
    );
}

/// Every value gRFC A6 allows that `from_json` accepts, `service_config` builds into a client:
/// the parse and the build agree on every field that becomes a retry, hedging or throttle
/// knob. What the retry layer cannot take as is (a `maxBackoff` above its 1 h limit) is
/// clamped, as the module docs say.
#[test]
fn every_value_a6_allows_builds_a_client() {
    let r = |fields: &str| retry(fields);
    let h = |fields: &str| one_method(&format!(r#""hedgingPolicy": {{ {fields} }}"#));
    let cases: Vec<(&str, String)> = vec![
        (
            "maxBackoff above 1 h",
            r(&GOOD_RETRY.replace(r#""1s""#, r#""7200s""#)),
        ),
        (
            "both backoffs above 1 h",
            r(&GOOD_RETRY
                .replace(r#"".1s""#, r#""7200s""#)
                .replace(r#""1s""#, r#""9000s""#)),
        ),
        (
            "proto3's longest duration",
            r(&GOOD_RETRY.replace(r#""1s""#, r#""315576000000s""#)),
        ),
        (
            "initialBackoff above maxBackoff",
            r(&GOOD_RETRY.replace(r#"".1s""#, r#""5s""#)),
        ),
        (
            "1 ns backoff",
            r(&GOOD_RETRY.replace(r#"".1s""#, r#"".000000001s""#)),
        ),
        (
            "multiplier below 1",
            r(&GOOD_RETRY.replace(r#""backoffMultiplier": 2"#, r#""backoffMultiplier": 0.5"#)),
        ),
        (
            "huge multiplier",
            r(&GOOD_RETRY.replace(r#""backoffMultiplier": 2"#, r#""backoffMultiplier": 1e300"#)),
        ),
        (
            "maxAttempts above the cap",
            r(&GOOD_RETRY.replace(r#""maxAttempts": 4"#, r#""maxAttempts": 1000000"#)),
        ),
        (
            "hedging, many attempts",
            h(r#""maxAttempts": 99, "hedgingDelay": "7200s""#),
        ),
        (
            "hedging, longest delay",
            h(r#""maxAttempts": 2, "hedgingDelay": "315576000000s""#),
        ),
        (
            "longest timeout",
            one_method(r#""timeout": "315576000000s""#),
        ),
        ("zero timeout", one_method(r#""timeout": "0s""#)),
        (
            "largest throttle",
            r#"{ "retryThrottling": { "maxTokens": 1000, "tokenRatio": 1000 } }"#.into(),
        ),
        (
            "smallest token ratio",
            r#"{ "retryThrottling": { "maxTokens": 1, "tokenRatio": 0.001 } }"#.into(),
        ),
    ];
    for (what, json) in &cases {
        let config = ServiceConfig::from_json(json).unwrap_or_else(|e| panic!("{what}: {e}"));
        if let Err(e) = crate::client::grpc().service_config(config) {
            panic!("{what}: accepted by from_json, refused by service_config: {e}");
        }
    }
    // The clamp: A6's formula with `maxBackoff` at the retry layer's limit.
    let config =
        ServiceConfig::from_json(&r(&GOOD_RETRY.replace(r#""1s""#, r#""7200s""#))).unwrap();
    let Some(MethodPolicy::Retry(policy)) = &config.methods[0].policy else {
        panic!("a retry policy")
    };
    assert_eq!(
        policy.max_backoff,
        Duration::from_secs(7200),
        "kept as written"
    );
    assert_eq!(
        policy.backoff(),
        crate::client::retry::backoff::exponential(
            100 * MS,
            crate::client::retry::backoff::MAX_DELAY
        )
        .jitter(crate::client::retry::backoff::Jitter::Proportional(0.2))
    );
}

/// What A6 (or proto3 JSON) refuses, `from_json` refuses, naming the field's JSON path.
#[test]
fn values_outside_a6_are_refused_by_their_path() {
    let p = "methodConfig[0]";
    let h = |fields: &str| one_method(&format!(r#""hedgingPolicy": {{ {fields} }}"#));
    let cases: Vec<(String, String)> = vec![
        (
            retry(&GOOD_RETRY.replace(r#"["UNAVAILABLE"]"#, r#"["UNAVAILABLE", "OK"]"#)),
            format!("{p}.retryPolicy.retryableStatusCodes[1]"),
        ),
        (
            h(r#""maxAttempts": 2, "nonFatalStatusCodes": ["OK"]"#),
            format!("{p}.hedgingPolicy.nonFatalStatusCodes[0]"),
        ),
        (
            one_method(r#""timeout": "315576000001s""#),
            format!("{p}.timeout"),
        ),
        (
            retry(&GOOD_RETRY.replace(r#""1s""#, r#""315576000001s""#)),
            format!("{p}.retryPolicy.maxBackoff"),
        ),
        (
            h(r#""maxAttempts": 2, "hedgingDelay": "99999999999999999999s""#),
            format!("{p}.hedgingPolicy.hedgingDelay"),
        ),
    ];
    for (json, knob) in &cases {
        assert_eq!(&rejected(json), knob, "{json}");
    }
}

/// A config built by hand (its fields are public) is checked by `service_config` with the
/// rules `from_json` applies, and refused by the JSON path of the field at fault, never by a
/// knob of the retry crate, and never with a panic.
#[test]
fn a_config_built_by_hand_is_refused_by_its_json_path() {
    let retry_policy = RetryPolicyConfig {
        max_attempts: 3,
        initial_backoff: 100 * MS,
        max_backoff: Duration::from_secs(7200),
        backoff_multiplier: 2.0,
        retryable_status_codes: vec![Code::Unavailable],
    };
    let hedging = HedgingPolicyConfig {
        max_attempts: 2,
        hedging_delay: Duration::ZERO,
        non_fatal_status_codes: vec![],
    };
    let with = |policy: MethodPolicy| ServiceConfig {
        methods: vec![
            crate::service_config::MethodConfig {
                names: vec![MethodName {
                    service: Some("a.A".into()),
                    method: None,
                }],
                timeout: None,
                policy: None,
            },
            crate::service_config::MethodConfig {
                names: vec![MethodName {
                    service: Some("s.S".into()),
                    method: None,
                }],
                timeout: None,
                policy: Some(policy),
            },
        ],
        retry_throttling: None,
    };
    let build = |config: ServiceConfig| crate::client::grpc().service_config(config).map(drop);
    assert!(build(with(MethodPolicy::Retry(retry_policy.clone()))).is_ok());
    assert!(build(with(MethodPolicy::Hedging(hedging.clone()))).is_ok());
    // Each case: one field of a valid config made invalid.
    let retrying = |change: fn(&mut RetryPolicyConfig)| {
        let mut policy = retry_policy.clone();
        change(&mut policy);
        with(MethodPolicy::Retry(policy))
    };
    let hedging_up_to = |max_attempts| {
        with(MethodPolicy::Hedging(HedgingPolicyConfig {
            max_attempts,
            ..hedging.clone()
        }))
    };
    let throttled = |max_tokens, token_ratio| ServiceConfig {
        retry_throttling: Some(RetryThrottling {
            max_tokens,
            token_ratio,
        }),
        ..with(MethodPolicy::Hedging(hedging.clone()))
    };
    let p = "methodConfig[1]";
    let cases: Vec<(ServiceConfig, String)> = vec![
        (
            retrying(|r| r.max_attempts = 11),
            format!("{p}.retryPolicy.maxAttempts"),
        ),
        (
            retrying(|r| r.max_attempts = 1),
            format!("{p}.retryPolicy.maxAttempts"),
        ),
        (
            retrying(|r| r.initial_backoff = Duration::ZERO),
            format!("{p}.retryPolicy.initialBackoff"),
        ),
        (
            retrying(|r| r.max_backoff = Duration::ZERO),
            format!("{p}.retryPolicy.maxBackoff"),
        ),
        (
            retrying(|r| r.backoff_multiplier = f64::NAN),
            format!("{p}.retryPolicy.backoffMultiplier"),
        ),
        (
            retrying(|r| r.retryable_status_codes = vec![]),
            format!("{p}.retryPolicy.retryableStatusCodes"),
        ),
        (
            retrying(|r| r.retryable_status_codes = vec![Code::Unavailable, Code::Ok]),
            format!("{p}.retryPolicy.retryableStatusCodes[1]"),
        ),
        (hedging_up_to(1), format!("{p}.hedgingPolicy.maxAttempts")),
        (hedging_up_to(11), format!("{p}.hedgingPolicy.maxAttempts")),
        (throttled(0, 0.1), "retryThrottling.maxTokens".to_owned()),
        (
            throttled(10, 0.0004),
            "retryThrottling.tokenRatio".to_owned(),
        ),
        (throttled(10, 11.0), "retryThrottling.tokenRatio".to_owned()),
    ];
    for (i, (config, knob)) in cases.into_iter().enumerate() {
        let validated = config.validate().map_err(|e| e.knob().to_owned());
        assert_eq!(validated.err().as_ref(), Some(&knob), "case {i}: {knob}");
        let built = build(config).map_err(|e| e.knob().to_owned());
        assert_eq!(built.err().as_ref(), Some(&knob), "case {i}: {knob}");
    }
}

mod dispatch {
    use super::*;
    use crate::ReplayBody;
    use http::{Request, Response};
    use std::sync::{Arc, Mutex};
    use tower::{Layer, Service, ServiceExt, service_fn};

    /// What the dependency saw: each attempt's path, `grpc-timeout` and when it came.
    type Seen = Arc<Mutex<Vec<(String, Option<String>, Duration)>>>;

    /// A dependency that answers every call UNAVAILABLE at once.
    fn unavailable(
        seen: Seen,
    ) -> impl backstop_test_support::Dependency<Request<ReplayBody<String>>> {
        let t0 = tokio::time::Instant::now();
        service_fn(move |req: Request<ReplayBody<String>>| {
            let timeout = req
                .headers()
                .get("grpc-timeout")
                .map(|v| v.to_str().unwrap().to_owned());
            seen.lock()
                .unwrap()
                .push((req.uri().path().to_owned(), timeout, t0.elapsed()));
            async {
                let response = Response::builder()
                    .header("content-type", "application/grpc")
                    .header("grpc-status", "14")
                    .body(String::new());
                Ok(response.unwrap())
            }
        })
    }

    fn call(path: &str) -> Request<String> {
        Request::post(format!("http://bank{path}"))
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap()
    }

    /// Calls each of `paths` once through the gRPC preset with `config`, over an `unavailable`
    /// dependency: each call ends UNAVAILABLE. Returns the layer, what the dependency saw, and
    /// the paths of the attempts in their order.
    async fn call_each(
        config: ServiceConfig,
        paths: &[&str],
    ) -> (
        crate::methods::MethodsLayer,
        Vec<(String, Option<String>, Duration)>,
        Vec<String>,
    ) {
        let layer = crate::client::grpc().service_config(config).unwrap();
        let seen: Seen = Arc::default();
        let client = layer.layer(unavailable(seen.clone()));
        for path in paths {
            let response = client.clone().oneshot(call(path)).await.unwrap();
            assert_eq!(response.headers()["grpc-status"], "14", "{path}");
        }
        let seen = seen.lock().unwrap().clone();
        let attempts = seen.iter().map(|(p, ..)| p.clone()).collect();
        (layer, seen, attempts)
    }

    /// The longest values A6 allows serve calls: a timeout of proto3's longest duration (a
    /// deadline far off, a well-formed `grpc-timeout`), backoffs of two hours (waits capped
    /// at 1 h), a hedging delay that never comes.
    #[tokio::test(start_paused = true)]
    async fn the_longest_values_a6_allows_serve_calls() {
        let config = ServiceConfig::from_json(
            r#"{ "methodConfig": [
                { "name": [{}], "timeout": "315576000000s",
                  "retryPolicy": { "maxAttempts": 3, "initialBackoff": "7200s",
                                   "maxBackoff": "7200s", "backoffMultiplier": 2,
                                   "retryableStatusCodes": ["UNAVAILABLE"] } },
                { "name": [{ "service": "a.Hedged" }], "timeout": "315576000000s",
                  "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "315576000000s" } }
              ] }"#,
        )
        .unwrap();
        let (_, seen, paths) = call_each(config, &["/a.Retried/Call", "/a.Hedged/Call"]).await;
        assert_eq!(
            paths,
            [
                "/a.Retried/Call",
                "/a.Retried/Call",
                "/a.Retried/Call",
                "/a.Hedged/Call"
            ]
        );
        for (_, timeout, _) in &seen {
            let timeout = timeout.as_deref().expect("the attempt bound is sent");
            let (digits, unit) = timeout.split_at(timeout.len() - 1);
            assert!(
                digits.len() <= 8 && digits.bytes().all(|b| b.is_ascii_digit()),
                "{timeout}"
            );
            assert!("HMSmun".contains(unit), "{timeout}");
        }
        for pair in seen[..3].windows(2) {
            assert!(
                pair[1].2 - pair[0].2 <= Duration::from_secs(3600),
                "capped at 1 h"
            );
        }
    }

    /// One JSON, three behaviours: `GetBalance` retried 4 times with A6's backoff, `Charge`
    /// never retried, every other method on the default entry's timeout, unretried.
    #[tokio::test(start_paused = true)]
    async fn each_method_gets_its_own_policy() {
        let config = ServiceConfig::from_json(
            r#"{ "methodConfig": [
                { "name": [{}], "timeout": "2s" },
                { "name": [{ "service": "bank.Accounts", "method": "GetBalance" }],
                  "timeout": "5s",
                  "retryPolicy": { "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                                   "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"] } },
                { "name": [{ "service": "bank.Accounts", "method": "Charge" }] }
              ],
              "retryThrottling": { "maxTokens": 100, "tokenRatio": 0.1 } }"#,
        )
        .unwrap();
        let (layer, seen, paths) = call_each(
            config,
            &[
                "/bank.Accounts/GetBalance",
                "/bank.Accounts/Charge",
                "/bank.Cards/List",
            ],
        )
        .await;
        assert_eq!(
            paths,
            [
                "/bank.Accounts/GetBalance",
                "/bank.Accounts/GetBalance",
                "/bank.Accounts/GetBalance",
                "/bank.Accounts/GetBalance",
                "/bank.Accounts/Charge",
                "/bank.Cards/List",
            ]
        );
        // GetBalance: its 5 s timeout, all of it, as grpcio tells it: an attempt that ran out
        // of time would not be retried (a gRPC call is not idempotent by default), so the
        // attempt bound keeps no share for a retry; retries of its UNAVAILABLE answers within
        // A6's envelopes (0.1, 0.2, 0.4 s), a fifth either side (A6 as updated in 2024).
        assert_eq!(seen[0].1.as_deref(), Some("5S"));
        let mut envelope = Duration::from_millis(100);
        for pair in seen[..4].windows(2) {
            let gap = pair[1].2 - pair[0].2;
            assert!(
                gap <= envelope.mul_f64(1.2),
                "{gap:?} above 1.2 × {envelope:?}"
            );
            assert!(
                gap >= envelope.mul_f64(0.8),
                "{gap:?} below 0.8 × {envelope:?}"
            );
            envelope *= 2;
        }
        // Charge has an entry of its own, without a timeout: no deadline at all (the default
        // entry's does not apply to it).
        assert_eq!(seen[4].1, None);
        // Everything else: the default entry's 2 s, all of it (no retry policy, so no retry
        // needs room; gRPC's own clients do the same).
        assert_eq!(seen[5].1.as_deref(), Some("2S"));
        let stats = layer.retry_layer(1).unwrap().stats();
        assert_eq!(stats.retries, 3);
        assert_eq!(layer.retry_layer(2).unwrap().stats().retries, 0);
    }

    /// A config with two entries (three retry layers: the default too).
    fn two_entries() -> ServiceConfig {
        ServiceConfig::from_json(
            r#"{ "methodConfig": [
                { "name": [{ "service": "bank.Accounts", "method": "GetBalance" }],
                  "retryPolicy": { "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
                                   "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"] } },
                { "name": [{ "service": "bank.Accounts", "method": "Charge" }] }
              ],
              "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 } }"#,
        )
        .unwrap()
    }

    /// Defect (issue 23, 3): `poll_ready` polled every method's route, each a clone of the
    /// transport, so a transport that reserves capacity there (`ConcurrencyLimit`, a
    /// `Buffer`: a tonic `Channel`) was never ready for one call with two entries. One
    /// transport is made ready, for the call it serves.
    #[tokio::test(start_paused = true)]
    async fn a_call_reserves_capacity_once_whatever_the_number_of_methods() {
        let layer = crate::client::grpc().service_config(two_entries()).unwrap();
        let seen: Seen = Arc::default();
        let limited = tower::limit::ConcurrencyLimit::new(unavailable(seen.clone()), 1);
        let mut client = layer.layer(limited);
        for path in ["/bank.Accounts/Charge", "/bank.Cards/List"] {
            let ready = tokio::time::timeout(Duration::from_secs(1), client.ready()).await;
            let response = ready
                .expect("ready with one permit")
                .unwrap()
                .call(call(path))
                .await
                .unwrap();
            assert_eq!(response.headers()["grpc-status"], "14");
        }
        // A `Buffer` (what a tonic `Channel` is) with room for one request.
        let buffered = tower::buffer::Buffer::new(unavailable(seen.clone()), 1);
        let mut client = layer.layer(buffered);
        let ready = tokio::time::timeout(Duration::from_secs(1), client.ready()).await;
        let response = ready
            .expect("ready with one slot")
            .unwrap()
            .call(call("/bank.Accounts/GetBalance"))
            .await
            .unwrap();
        assert_eq!(response.headers()["grpc-status"], "14");
        assert_eq!(seen.lock().unwrap().len(), 2 + 3);
    }

    /// Defect (issue 23, 9): methods without a retry policy had budgets of their own, so
    /// their failures never reached the channel's throttle (A6 counts every call, whatever
    /// its method). Six failed `Charge` calls take the throttle below half: `GetBalance` is
    /// then not retried.
    #[tokio::test(start_paused = true)]
    async fn the_throttle_hears_every_method() {
        let layer = crate::client::grpc().service_config(two_entries()).unwrap();
        let seen: Seen = Arc::default();
        let client = layer.layer(unavailable(seen.clone()));
        for _ in 0..6 {
            let response = client
                .clone()
                .oneshot(call("/bank.Accounts/Charge"))
                .await
                .unwrap();
            assert_eq!(response.headers()["grpc-status"], "14");
        }
        seen.lock().unwrap().clear();
        client
            .oneshot(call("/bank.Accounts/GetBalance"))
            .await
            .unwrap();
        assert_eq!(
            seen.lock().unwrap().len(),
            1,
            "no retry with the throttle at 4 of 10"
        );
    }
}

/// gRFC A6 as updated in 2024 (grpc/proposal#452), as grpc-js and grpcio wait: the n-th retry
/// waits `min(initialBackoff × multiplier^(n−1), maxBackoff) × random(0.8, 1.2)`. For 0.1 s × 2
/// the referees measured 94, 205, 412, 704 ms and 115, 193, 453, 672 ms; the 2017 formula
/// (`random(0, …)`) gave 96, 56, 330, 647 ms: a second retry sooner than the first.
#[test]
fn the_backoff_is_a6_2024s_envelope_a_fifth_either_side() {
    use crate::client::retry::backoff::{Backoff, BackoffState, Rng};
    let config = ServiceConfig::from_json(&retry(
        r#""maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#,
    ))
    .unwrap();
    let Some(MethodPolicy::Retry(policy)) = &config.methods[0].policy else {
        panic!("a retry policy")
    };
    let backoff = policy.backoff();
    let envelopes = [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS];
    for seed in 0..200 {
        let mut rng = Rng::with_seed(seed);
        let mut state = BackoffState::default();
        for (n, envelope) in envelopes.iter().enumerate() {
            state.retry = n as u32 + 1;
            let wait = backoff.next_delay(&mut state, &mut rng);
            assert!(
                wait >= envelope.mul_f64(0.8) && wait <= envelope.mul_f64(1.2),
                "seed {seed}, retry {}: {wait:?} outside 0.8..1.2 × {envelope:?}",
                n + 1
            );
        }
    }
}

/// A number beyond an `f64`'s range is valid JSON syntax the reader refuses before any field
/// is read: the config as a whole is named, with the line and column (the module docs say
/// so), never a panic or an infinite value.
#[test]
fn a_number_beyond_f64_is_refused_by_line_and_column() {
    for json in [
        retry(r#""maxAttempts": 1e400"#),
        retry(r#""backoffMultiplier": 1e400"#),
        r#"{ "retryThrottling": { "maxTokens": 10, "tokenRatio": -1e400 } }"#.to_owned(),
    ] {
        let err = ServiceConfig::from_json(&json).unwrap_err();
        assert_eq!(err.knob(), "service config", "{json}");
        assert!(err.reason().contains("line 1 column"), "{err}");
    }
}
