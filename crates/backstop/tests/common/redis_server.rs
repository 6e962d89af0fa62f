//! A real `redis-server` on 127.0.0.1 and a free port, for the Redis tests.
//!
//! The tests start their own server: `redis-server` must be on `PATH` (`.ci/run` installs the
//! Debian package). Without it they fail with a message saying so, unless
//! `BACKSTOP_SKIP_REDIS=1`, when they print why and pass. The server runs under a shell that
//! kills it as soon as its stdin closes, so it dies with the test process however that ends.
//!
//! Starting and stopping the process waits on its port with a blocking sleep: test-only
//! code, run outside a runtime's hot path, and the only clock that matters here is the OS's.
#![allow(clippy::disallowed_methods)]

use std::{
    io::Write,
    net::{TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

/// A redis-server process, killed when dropped (or when the test process exits).
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    /// Where an append-only file keeps every write (fsync each), for a server whose data
    /// must survive a kill; `None`: nothing is kept.
    dir: Option<std::path::PathBuf>,
}

/// Whether the Redis tests can run here; `false` (after printing why) only when the user
/// asked to skip them.
pub fn available() -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return true;
    }
    if std::env::var("BACKSTOP_SKIP_REDIS").as_deref() == Ok("1") {
        eprintln!("skipped: no redis-server on PATH and BACKSTOP_SKIP_REDIS=1");
        return false;
    }
    panic!(
        "the Redis tests need redis-server on PATH (apt-get install redis-server), \
         or BACKSTOP_SKIP_REDIS=1 to skip them"
    );
}

impl RedisServer {
    /// A server on a free port, up and answering.
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = Self {
            port,
            child: None,
            dir: None,
        };
        server.restart();
        server
    }

    /// A server on a free port that keeps every write in an append-only file (fsync on
    /// each), so a kill loses nothing and a restart reads it all back.
    pub fn start_persistent() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("backstop-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a data directory");
        let mut server = Self {
            port,
            child: None,
            dir: Some(dir),
        };
        server.restart();
        server
    }

    /// The server shared by the tests of one test binary (each test connects on its own
    /// runtime and uses keys of its own).
    pub fn shared() -> &'static RedisServer {
        static SHARED: OnceLock<RedisServer> = OnceLock::new();
        SHARED.get_or_init(RedisServer::start)
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (SIGKILL: no shutdown, nothing saved).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(stdin) = child.stdin.as_mut() {
                let _ = stdin.write_all(b"\n");
            }
            let _ = child.wait();
        }
        for _ in 0..100 {
            if TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the server again on its port (empty, unless persistent).
    pub fn restart(&mut self) {
        self.kill();
        let persistence = match &self.dir {
            None => "--appendonly no".to_owned(),
            Some(dir) => format!(
                "--appendonly yes --appendfsync always --dir '{}'",
                dir.display()
            ),
        };
        let script = format!(
            "redis-server --port {} --bind 127.0.0.1 --save '' {persistence} \
             --logfile '' --loglevel warning >/dev/null & pid=$!; read _; kill -9 $pid; wait",
            self.port
        );
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("sh starts");
        self.child = Some(child);
        for _ in 0..250 {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server did not listen on 127.0.0.1:{} within 5 s",
            self.port
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
