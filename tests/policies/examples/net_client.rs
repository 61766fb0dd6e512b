//! Test policy: tries to open a network connection and to resolve a name.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    impl Guest for Policy {
        fn run(_: types::Settings) -> Result<types::Report, String> {
            let _ = host::load_checkpoint();
            let connected = std::net::TcpStream::connect("127.0.0.1:9").is_ok();
            let bound = std::net::UdpSocket::bind("127.0.0.1:0").is_ok();
            let resolved = std::net::ToSocketAddrs::to_socket_addrs("localhost:9").is_ok();
            Err(format!(
                "connected: {connected}, bound: {bound}, resolved: {resolved}"
            ))
        }
    }

    export!(Policy);
}
