//! One long-lived thread spawns every helper. The helper's death signal is
//! tied to the *thread* that forked it, and runtime worker threads come and
//! go; a thread that lives as long as the broker keeps the lifeline honest.

use crate::engine::helper::{HelperChild, HelperCommand, spawn};
use std::io;
use std::sync::mpsc;
use tokio::sync::oneshot;

type Job = (HelperCommand, oneshot::Sender<io::Result<HelperChild>>);

#[derive(Clone)]
pub struct Spawner {
    jobs: mpsc::Sender<Job>,
}

impl Spawner {
    pub fn start() -> io::Result<Spawner> {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new().name("palisade-spawner".into()).spawn(move || {
            for (cmd, reply) in rx {
                let _ = reply.send(spawn(cmd));
            }
        })?;
        Ok(Spawner { jobs })
    }

    pub async fn spawn(&self, cmd: HelperCommand) -> io::Result<HelperChild> {
        self.submit(cmd)?.await.map_err(|_| io::Error::other("the spawner thread is gone"))?
    }

    /// Hands `cmd` to the spawner thread now, which starts it while the
    /// caller goes on; the child, when it is wanted, from the receiver.
    pub fn submit(&self, cmd: HelperCommand) -> io::Result<oneshot::Receiver<io::Result<HelperChild>>> {
        let (tx, rx) = oneshot::channel();
        self.jobs.send((cmd, tx)).map_err(|_| io::Error::other("the spawner thread is gone"))?;
        Ok(rx)
    }
}
