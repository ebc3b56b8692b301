//! Generates the gRPC code from the .proto files (protoc: `scripts/install-build-deps`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=ingest.proto");
    tonic_prost_build::configure().compile_protos(&["ingest.proto"], &["."])?;
    Ok(())
}
