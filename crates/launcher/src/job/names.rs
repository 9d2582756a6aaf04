//! The job's name service (MPI_Publish_name, MPI_Lookup_name): one table at the root.

use std::collections::HashMap;

use pmi_wire::control::{NameAnswer, NameOp};

#[derive(Default)]
pub(crate) struct Names {
    /// service -> port
    published: HashMap<String, String>,
}

impl Names {
    pub(crate) fn serve(&mut self, op: NameOp) -> NameAnswer {
        match op {
            NameOp::Publish { service, port } => {
                let fresh = !self.published.contains_key(&service);
                if fresh {
                    self.published.insert(service, port);
                }
                NameAnswer::Published(fresh)
            }
            NameOp::Unpublish { service } => {
                NameAnswer::Unpublished(self.published.remove(&service).is_some())
            }
            NameOp::Lookup { service } => NameAnswer::Lookup(self.published.get(&service).cloned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_published_once_found_and_withdrawn() {
        let mut names = Names::default();
        let publish = |port: &str| NameOp::Publish { service: "s".into(), port: port.into() };
        let lookup = || NameOp::Lookup { service: "s".into() };
        assert_eq!(names.serve(publish("p1")), NameAnswer::Published(true));
        assert_eq!(names.serve(publish("p2")), NameAnswer::Published(false));
        assert_eq!(names.serve(lookup()), NameAnswer::Lookup(Some("p1".into())));
        let unpublish = || NameOp::Unpublish { service: "s".into() };
        assert_eq!(names.serve(unpublish()), NameAnswer::Unpublished(true));
        assert_eq!(names.serve(unpublish()), NameAnswer::Unpublished(false));
        assert_eq!(names.serve(lookup()), NameAnswer::Lookup(None));
    }
}
