//! Generates the gRPC code from the .proto files with protox, a protobuf compiler written in
//! Rust, so that building needs cargo and nothing else: no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: &[&str] = &["ingest.proto", "interserver.proto"];
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["."])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
