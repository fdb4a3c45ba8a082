//! The vrnic vhost-user device.
