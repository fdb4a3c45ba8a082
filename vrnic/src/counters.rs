//! [`counters!`](crate::counters): a struct of `u64` counters from one
//! list of names, with the names and iteration derived from it.
//!
//! The engine's [`DeviceStats`](crate::device::DeviceStats) and
//! [`QpStats`](crate::device::QpStats) and the vhost-user backend's
//! `BackendStats` are made with it, and `vrnic stats` prints their
//! [`NAMES`](crate::device::DeviceStats::NAMES) in list order: a counter
//! is added by one line in its list (plus the code that counts it).

/// Defines a struct of `u64` counters, one per listed name, each with its
/// doc comment, and the struct's attributes (derives: `Default` gives all
/// zero):
///
/// ```
/// vrnic::counters! {
///     /// Counters of a widget.
///     #[derive(Debug, Default)]
///     pub struct WidgetStats {
///         /// Widgets made.
///         made,
///         /// Widgets broken.
///         broken,
///     }
/// }
/// let s = WidgetStats { made: 2, broken: 1 };
/// assert_eq!(WidgetStats::NAMES, ["made", "broken"]);
/// assert_eq!(s.iter().collect::<Vec<_>>(), [("made", 2), ("broken", 1)]);
/// ```
///
/// The struct has:
/// - `COUNT`: the number of counters;
/// - `NAMES`: their names (the field names), in list order;
/// - `values()`: their values, in that order;
/// - `iter()`: `(name, value)` pairs, in that order;
/// - `add_all(&other)`: adds every counter of `other` (wrapping).
///
/// The list order is the order of every output made from it (`vrnic
/// stats`): new counters go at the end of a list whose output tools read.
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$fmeta])* pub $field: u64, )*
        }

        impl $name {
            /// Number of counters.
            pub const COUNT: usize = [$(stringify!($field)),*].len();
            /// The counters' names (their field names), in list order.
            pub const NAMES: [&'static str; Self::COUNT] = [$(stringify!($field)),*];

            /// The counters' values, in [`Self::NAMES`] order.
            pub fn values(&self) -> [u64; Self::COUNT] {
                [$(self.$field),*]
            }

            /// `(name, value)` for every counter, in [`Self::NAMES`] order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                Self::NAMES.into_iter().zip(self.values())
            }

            /// Adds every counter of `other` to this one's (wrapping).
            pub fn add_all(&mut self, other: &Self) {
                $( self.$field = self.$field.wrapping_add(other.$field); )*
            }
        }
    };
}
