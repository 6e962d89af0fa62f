//! OpenTelemetry's call durations (`SemconvLayer`) as a real Prometheus exporter renders them,
//! for calls over 127.0.0.1 to a real axum server through the HTTP preset and to a real tonic
//! server through the gRPC preset and a tonic client.

use axum::{Router, http::StatusCode, routing::get};
use backstop::ReplayBody;
use backstop::semconv::SemconvLayer;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower::{ServiceBuilder, ServiceExt};

#[test]
fn a_prometheus_exporter_shows_the_conventions_names_and_labels() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let app = Router::new()
                    .route("/ok", get(|| async { "ok" }))
                    .route("/teapot", get(|| async { StatusCode::IM_A_TEAPOT }));
                let (listener, addr) = backstop_integration::listener().await;
                tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
                let transport =
                    Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Empty<Bytes>>>();
                let client = ServiceBuilder::new()
                    .layer(backstop::client::http().name("local").build().unwrap())
                    .layer(SemconvLayer::new())
                    .service(transport);
                for path in ["/ok", "/ok", "/teapot"] {
                    let uri = format!("http://{addr}{path}");
                    let request = Request::get(uri).body(Empty::<Bytes>::new()).unwrap();
                    let response = client.clone().oneshot(request).await.unwrap();
                    let _ = response.into_body().collect().await.unwrap();
                }
            });
    });
    let text = handle.render();
    let port = text
        .lines()
        .find_map(|l| l.split("server_port=\"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .expect("a server_port label")
        .to_owned();
    // Prometheus writes the dots as underscores; the summary's count says how many calls.
    let series = |status: &str, error: Option<&str>| {
        let error = error.map_or(String::new(), |e| format!(",error_type=\"{e}\""));
        format!(
            "http_client_request_duration_count{{http_request_method=\"GET\",\
             server_address=\"127.0.0.1\",server_port=\"{port}\",\
             http_response_status_code=\"{status}\"{error}}}"
        )
    };
    assert!(
        text.contains(&format!("{} 2", series("200", None))),
        "{text}"
    );
    assert!(
        text.contains(&format!("{} 1", series("418", Some("418")))),
        "{text}"
    );
    // backstop's own series beside them, under their namespace.
    assert!(text.contains("backstop_client_requests{"), "{text}");
}

/// A tonic client behind the gRPC preset: each call is one `rpc.client.duration` sample, under
/// the conventions' gRPC attributes, its status code read from the call's end (trailers for a
/// reply, the headers for a trailers-only refusal).
#[test]
fn a_prometheus_exporter_shows_grpc_calls_under_the_rpc_conventions() {
    use backstop::tonic::TonicBodyLayer;
    use example_proto::helloworld::{HelloRequest, greeter_client::GreeterClient};
    use tonic::transport::Endpoint;

    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let port: u16 = metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let url = backstop_integration::start_greeter(None).await;
                let port = url.rsplit(':').next().unwrap().parse().unwrap();
                let channel = Endpoint::from_shared(url).unwrap().connect_lazy();
                let mut client = GreeterClient::new(
                    ServiceBuilder::new()
                        .layer(backstop::client::grpc().name("greeter").build().unwrap())
                        // The channel adds the origin: its requests carry only a path.
                        .layer(SemconvLayer::new().server("127.0.0.1", port))
                        .layer(TonicBodyLayer)
                        .service(channel),
                );
                for name in ["ada", "grace"] {
                    let hello = HelloRequest { name: name.into() };
                    client.say_hello(hello).await.unwrap();
                }
                // The server refuses this one: INVALID_ARGUMENT, not retried.
                let hello = HelloRequest {
                    name: "sleep:soon".into(),
                };
                let status = client.say_hello(hello).await.unwrap_err();
                assert_eq!(status.code(), tonic::Code::InvalidArgument);
                port
            })
    });
    let text = handle.render();
    // The summary's count line of the series with these labels (in whatever order).
    let count = |code: &str| {
        let want = [
            "rpc_system=\"grpc\"".to_owned(),
            "rpc_service=\"helloworld.Greeter\"".to_owned(),
            "rpc_method=\"SayHello\"".to_owned(),
            format!("rpc_grpc_status_code=\"{code}\""),
            "server_address=\"127.0.0.1\"".to_owned(),
            format!("server_port=\"{port}\""),
        ];
        text.lines()
            .filter(|l| l.starts_with("rpc_client_duration_count{"))
            .find(|l| want.iter().all(|w| l.contains(w.as_str())))
            .and_then(|l| l.rsplit(' ').next())
            .map(|n| n.to_owned())
    };
    assert_eq!(count("0").as_deref(), Some("2"), "{text}");
    assert_eq!(count("3").as_deref(), Some("1"), "{text}");
    // backstop's own series beside them, for the same dependency.
    assert!(
        text.lines()
            .any(|l| l.starts_with("backstop_client_requests{") && l.contains("greeter")),
        "{text}"
    );
}
