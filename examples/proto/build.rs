//! Generates the Greeter code with the protoc binary vendored by `protoc-bin-vendored`, so no
//! protoc has to be installed by hand.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_with_config(
            config,
            &["proto/helloworld.proto", "proto/collect.proto"],
            &["proto"],
        )?;
    Ok(())
}
