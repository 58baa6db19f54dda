// One HTTP/1.1 connection: reads requests through the parser front (http_parser.h), routes and
// authenticates each on its header, buffers small bodies within the listener's budget or
// streams large ones to a BodySink, runs handlers, and writes responses (response_head.h; file
// bodies sent from the page cache only, common/residency.h). Keep-alive, pipelining, timeouts,
// TLS.
#pragma once

#include <memory>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace sluice::api {

class HttpServer;

// Sockets bound to one io_context: no type-erased executor on the hot path.
using Socket =
    boost::asio::basic_stream_socket<boost::asio::ip::tcp, boost::asio::io_context::executor_type>;

// Serves an accepted connection until it closes (TLS when the server has a context). The
// server's connection count is released when the connection ends.
void ServeConnection(Socket&& sock, std::shared_ptr<HttpServer> srv);

}  // namespace sluice::api
