//! The endpoint behind `--handler-ms`: answers every request with `204 No Content` after a
//! fixed delay, so icq's http handler stands in for a command that takes that long without
//! a process per command.

use std::convert::Infallible;
use std::time::Duration;

use anyhow::{Context, Result};
use http_body_util::Empty;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// Serves on a free loopback port until the process exits; returns the endpoint's URL.
pub async fn serve(delay: Duration) -> Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the --handler-ms endpoint")?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = service_fn(move |_request: Request<Incoming>| async move {
                    tokio::time::sleep(delay).await;
                    let mut response = Response::new(Empty::<Bytes>::new());
                    *response.status_mut() = StatusCode::NO_CONTENT;
                    Ok::<_, Infallible>(response)
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(format!("http://{addr}/"))
}
