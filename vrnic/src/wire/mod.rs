//! Wire formats (filled in by the wire module work).
