//! A real OTLP/HTTP receiver for the tests: accepts `POST /v1/traces` and `/v1/metrics`
//! with protobuf bodies, decodes them with opentelemetry-proto and keeps them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

#[derive(Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
    metrics: Vec<ExportMetricsServiceRequest>,
    requests: usize,
}

pub struct Receiver {
    port: u16,
    received: Arc<Mutex<Received>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Received::default()));
        let keep = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let keep = keep.clone();
                std::thread::spawn(move || serve(stream, &keep));
            }
        });
        Receiver { port, received }
    }

    /// The base URL for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn requests(&self) -> usize {
        self.received.lock().unwrap().requests
    }

    fn spans(&self) -> Vec<Span> {
        let received = self.received.lock().unwrap();
        received
            .traces
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.clone())
            .collect()
    }

    /// The spans received once at least `n` arrived (or `limit` passed).
    pub fn wait_for_spans(&self, n: usize, limit: Duration) -> Vec<Span> {
        let start = Instant::now();
        loop {
            let spans = self.spans();
            if spans.len() >= n || start.elapsed() > limit {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn metrics(&self) -> Vec<ExportMetricsServiceRequest> {
        self.received.lock().unwrap().metrics.clone()
    }
}

/// One HTTP/1.1 connection: requests with a Content-Length body, answered 200 with an
/// empty (valid) protobuf export response.
fn serve(stream: TcpStream, received: &Mutex<Received>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_owned();
        let mut length = 0usize;
        let mut gzip = false;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                let name = name.trim().to_ascii_lowercase();
                if name == "content-length" {
                    length = value.trim().parse().unwrap_or(0);
                }
                if name == "content-encoding" && value.trim() != "identity" {
                    gzip = true;
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        assert!(!gzip, "the test receiver expects uncompressed OTLP");
        {
            let mut received = received.lock().unwrap();
            received.requests += 1;
            match path.as_str() {
                "/v1/traces" => received.traces.push(
                    ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP traces decode"),
                ),
                "/v1/metrics" => received.metrics.push(
                    ExportMetricsServiceRequest::decode(body.as_slice())
                        .expect("OTLP metrics decode"),
                ),
                _ => {}
            }
        }
        let response =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}
