//! One long-lived thread spawns every helper. The helper's death signal is
//! tied to the *thread* that forked it, and runtime worker threads come and
//! go; a thread that lives as long as the broker keeps the lifeline honest.

use crate::engine::helper::{HelperChild, HelperCommand, spawn};
use std::io;
use std::sync::mpsc;
use tokio::sync::oneshot;

/// What the spawner thread does with a helper right after starting it,
/// before anyone else has it (a warm slot's placement in its cgroup v1).
pub type AfterSpawn = Box<dyn FnOnce(HelperChild) -> io::Result<HelperChild> + Send>;

type Job = (HelperCommand, Option<AfterSpawn>, oneshot::Sender<io::Result<HelperChild>>);

#[derive(Clone)]
pub struct Spawner {
    jobs: mpsc::Sender<Job>,
}

impl Spawner {
    pub fn start() -> io::Result<Spawner> {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new().name("palisade-spawner".into()).spawn(move || {
            for (cmd, after, reply) in rx {
                let started = spawn(cmd).and_then(|helper| match after {
                    Some(after) => after(helper),
                    None => Ok(helper),
                });
                let _ = reply.send(started);
            }
        })?;
        Ok(Spawner { jobs })
    }

    pub async fn spawn(&self, cmd: HelperCommand) -> io::Result<HelperChild> {
        self.spawn_then(cmd, None).await
    }

    /// As [`Spawner::spawn`], and then `after` on the spawner thread.
    pub async fn spawn_then(&self, cmd: HelperCommand, after: Option<AfterSpawn>) -> io::Result<HelperChild> {
        self.submit(cmd, after)?.await.map_err(|_| io::Error::other("the spawner thread is gone"))?
    }

    /// Hands `cmd` (and `after`) to the spawner thread now, which starts it
    /// while the caller goes on; the child, when it is wanted, from the
    /// receiver.
    pub fn submit(
        &self,
        cmd: HelperCommand,
        after: Option<AfterSpawn>,
    ) -> io::Result<oneshot::Receiver<io::Result<HelperChild>>> {
        let (tx, rx) = oneshot::channel();
        self.jobs.send((cmd, after, tx)).map_err(|_| io::Error::other("the spawner thread is gone"))?;
        Ok(rx)
    }
}
