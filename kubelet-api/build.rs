//! The three services gpupin speaks with the kubelet, generated without .proto files
//! (`tonic_build::manual`): the messages are the prost structs in src/.

use tonic_build::manual::{Builder, Method, Service};

const CODEC: &str = "tonic_prost::ProstCodec";

/// One unary method (or server-streaming where `streaming`) from `module`'s messages.
fn method(
    module: &str,
    name: &str,
    route: &str,
    input: &str,
    output: &str,
    streaming: bool,
) -> Method {
    let builder = Method::builder()
        .name(name)
        .route_name(route)
        .input_type(format!("crate::{module}::{input}"))
        .output_type(format!("crate::{module}::{output}"))
        .codec_path(CODEC);
    match streaming {
        true => builder.server_streaming().build(),
        false => builder.build(),
    }
}

fn main() {
    let dp = "deviceplugin";
    let registration = Service::builder()
        .name("Registration")
        .package("v1beta1")
        .method(method(
            dp,
            "register",
            "Register",
            "RegisterRequest",
            "Empty",
            false,
        ))
        .build();
    let device_plugin = Service::builder()
        .name("DevicePlugin")
        .package("v1beta1")
        .method(method(
            dp,
            "get_device_plugin_options",
            "GetDevicePluginOptions",
            "Empty",
            "DevicePluginOptions",
            false,
        ))
        .method(method(
            dp,
            "list_and_watch",
            "ListAndWatch",
            "Empty",
            "ListAndWatchResponse",
            true,
        ))
        .method(method(
            dp,
            "get_preferred_allocation",
            "GetPreferredAllocation",
            "PreferredAllocationRequest",
            "PreferredAllocationResponse",
            false,
        ))
        .method(method(
            dp,
            "allocate",
            "Allocate",
            "AllocateRequest",
            "AllocateResponse",
            false,
        ))
        .method(method(
            dp,
            "pre_start_container",
            "PreStartContainer",
            "PreStartContainerRequest",
            "PreStartContainerResponse",
            false,
        ))
        .build();
    let pod_resources = Service::builder()
        .name("PodResourcesLister")
        .package("v1")
        .method(method(
            "podresources",
            "list",
            "List",
            "ListPodResourcesRequest",
            "ListPodResourcesResponse",
            false,
        ))
        .build();
    Builder::new().compile(&[registration, device_plugin, pod_resources]);
    println!("cargo:rerun-if-changed=build.rs");
}
