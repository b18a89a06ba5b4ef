//! A panic in one request's handling stays in that request: [`Caught`]
//! turns it into a value, so the connection's client is answered
//! `RuntimeFailure` and the daemon goes on serving the others.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future whose panic is caught: `Err` carries the panic's message.
/// The future that panicked is never polled again; dropping it runs its
/// destructors (a run's kill-on-drop guard, its cgroup's removal).
pub struct Caught<F>(Pin<Box<F>>);

impl<F: Future> Caught<F> {
    pub fn new(future: F) -> Caught<F> {
        Caught(Box::pin(future))
    }
}

impl<F: Future> Future for Caught<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Unwind safety: after a panic the inner future is only dropped, never
        // polled again, so no broken invariant of it is observed.
        match catch_unwind(AssertUnwindSafe(|| self.0.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Err(payload) => Poll::Ready(Err(message(payload.as_ref()))),
        }
    }
}

/// What a panic said, when it said it with a string.
pub fn message(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_becomes_its_message_and_a_value_passes_through() {
        assert_eq!(Caught::new(async { 7 }).await, Ok(7));
        let caught = Caught::new(async {
            tokio::task::yield_now().await;
            panic!("broken {}", 42);
        });
        assert_eq!(caught.await, Err::<(), _>("broken 42".into()));
        let caught = Caught::new(async { std::panic::panic_any(3u8) });
        assert_eq!(caught.await, Err::<(), _>("a panic without a message".into()));
    }
}
