//! Helpers shared by the retry layer's gRPC tests.

use http::{Request, Response};

/// A unary gRPC request to `pkg.Svc/Call`.
pub(crate) fn grpc() -> Request<String> {
    Request::post("http://svc/pkg.Svc/Call")
        .header("content-type", "application/grpc")
        .body("msg".to_owned())
        .unwrap()
}

/// A trailers-only gRPC response with `code`, and `grpc-retry-pushback-ms` if given.
pub(crate) fn status(code: u16, pushback: Option<&str>) -> Response<String> {
    let mut r = Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", code.to_string());
    if let Some(p) = pushback {
        r = r.header("grpc-retry-pushback-ms", p);
    }
    r.body(String::new()).unwrap()
}
